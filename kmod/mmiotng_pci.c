// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: PCI devices that a driver binds to during an --all session,
 * and devices that go away.
 *
 * With NEW_DEVICES on (mmiotrace-ng --all), every memory BAR and the ROM of
 * a PCI device that a driver is about to bind to get a filter: the bus
 * notifier sees BUS_NOTIFY_BIND_DRIVER before the driver's probe runs, so
 * the probe's ioremap calls are traced like any other.  This covers devices
 * that appear while tracing (a rescan, a hot-plug) and devices whose
 * driver is loaded while tracing.  A range that cannot get a filter is
 * said: a NOT traced record with virtual address 0.
 *
 * In every session, a device that is removed (hot-unplug, sysfs remove)
 * takes the filters in its BARs with it, each said by such a record with
 * -ENODEV: its driver is unbound by then, and whatever gets the range next
 * is another device.
 *
 * Locking in this file:
 *  - The notifier runs in process context (the bus notifier chain
 *    read-locked; at bind the device lock held, at removal the PCI
 *    rescan/remove lock) and takes ng_mutex; ng_new_devices is
 *    read and written under ng_mutex only.  Nothing holding ng_mutex waits
 *    for a device lock or the notifier chain, so this cannot deadlock.
 *  - Module exit unregisters the notifier (which waits for a running one)
 *    before it takes ng_mutex to disarm.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/device.h>
#include <linux/notifier.h>
#include <linux/pci.h>

#include "mmiotng.h"

static bool ng_new_devices;	/* ng_mutex */

/* ng_mutex held */
void ng_trace_new_devices(bool on)
{
	lockdep_assert_held(&ng_mutex);
	ng_new_devices = on;
}

static bool ng_traceable(const struct resource *r)
{
	return resource_type(r) == IORESOURCE_MEM && r->start && resource_size(r) &&
	       !(r->flags & (IORESOURCE_UNSET | IORESOURCE_DISABLED));
}

/* A filter for each memory BAR and the ROM of pdev not yet traced. */
static void ng_add_device(struct pci_dev *pdev)
{
	int i, ret;

	for (i = 0; i <= PCI_ROM_RESOURCE; i++) {
		const struct resource *r = &pdev->resource[i];

		if (!ng_traceable(r))
			continue;
		ret = ng_filter_add(r->start, resource_size(r));
		if (ret == -EEXIST && ng_find_filter(r->start, resource_size(r)))
			continue;	/* traced already */
		if (ret) {
			this_cpu_inc(ng_stats.refused);
			ng_report_map(0, r->start, resource_size(r), ret);
		}
	}
}

/* The filters in the memory BARs and the ROM of pdev, which is gone. */
static void ng_drop_device(struct pci_dev *pdev)
{
	int i;

	for (i = 0; i <= PCI_ROM_RESOURCE; i++) {
		const struct resource *r = &pdev->resource[i];

		if (ng_traceable(r))
			ng_filters_drop(r->start, resource_size(r));
	}
}

static int ng_pci_event(struct notifier_block *nb, unsigned long action, void *data)
{
	struct device *dev = data;

	if (action != BUS_NOTIFY_BIND_DRIVER && action != BUS_NOTIFY_REMOVED_DEVICE)
		return NOTIFY_DONE;
	mutex_lock(&ng_mutex);
	if (action == BUS_NOTIFY_REMOVED_DEVICE)
		ng_drop_device(to_pci_dev(dev));
	else if (ng_new_devices)
		ng_add_device(to_pci_dev(dev));
	mutex_unlock(&ng_mutex);
	return NOTIFY_DONE;
}

static struct notifier_block ng_pci_nb = {
	.notifier_call = ng_pci_event,
};

int ng_pci_init(void)
{
	return bus_register_notifier(&pci_bus_type, &ng_pci_nb);
}

void ng_pci_exit(void)
{
	bus_unregister_notifier(&pci_bus_type, &ng_pci_nb);
}
