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
 * A traced BAR that moves (a driver resizing it in its probe, as GPU
 * drivers do, or sysfs resourceN_resize) is followed: every move releases
 * the BAR (pci_release_resource: its old range is noted, ng_moving) and
 * assigns it anew (pci_assign_resource, called through
 * ng_pci_assign_resource() while a move is noted); the filter then moves
 * to the new range before the caller can map it (ng_filter_move, said with
 * -EXDEV).  A BAR put back by other means (a failed resize restoring the
 * old range) never left its filter.
 *
 * Locking in this file:
 *  - The notifier runs in process context (the bus notifier chain
 *    read-locked; at bind the device lock held, at removal the PCI
 *    rescan/remove lock) and takes ng_mutex; ng_new_devices is
 *    read and written under ng_mutex only.  Nothing holding ng_mutex waits
 *    for a device lock or the notifier chain, so this cannot deadlock.
 *  - Module exit unregisters the notifier (which waits for a running one)
 *    before it takes ng_mutex to disarm.
 *  - ng_release_ftrace() runs at the entry of pci_release_resource(), in
 *    the caller's process context with preemption off: it only notes the
 *    move in ng_moving, under ng_lock.  ng_pci_assign_resource() runs in
 *    place of pci_assign_resource(), in its caller's context, which may
 *    hold pci_bus_sem (a resize does), which holders of ng_mutex take
 *    (ng_filter_add): it never waits for ng_mutex, it tries for a while
 *    and else says the move was not followed.  Module exit unhooks both
 *    and waits for the wrappers that run (ng_assign_inflight), then for
 *    every task to have left the module's code (RCU Tasks).
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/device.h>
#include <linux/ftrace.h>
#include <linux/module.h>
#include <linux/notifier.h>
#include <linux/pci.h>
#include <linux/rcupdate.h>

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

/* ---- BARs that move ---------------------------------------------- */

/* A traced BAR released, to be assigned anew: ng_lock. */
struct ng_moving {
	const struct pci_dev *dev;	/* compared, never used */
	int resno;
	phys_addr_t start;
	u64 size;
};

#define NG_MOVING	32	/* a resize releases every BAR of its device */
static struct ng_moving ng_moving[NG_MOVING];
static unsigned int ng_nmoving;	/* entries in use; read without the lock */
static atomic_t ng_assign_inflight = ATOMIC_INIT(0);
static bool ng_moves_hooked;

static void notrace ng_release_ftrace(unsigned long ip, unsigned long parent_ip,
				      struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	struct pt_regs *regs = ftrace_get_regs(fregs);
	const struct pci_dev *dev;
	const struct resource *r;
	unsigned int i, slot = NG_MOVING;
	unsigned long flags;
	struct ng_filter *f;
	long resno;

	if (!regs)
		return;
	dev = (const struct pci_dev *)regs_get_kernel_argument(regs, 0);
	resno = (int)regs_get_kernel_argument(regs, 1);
	if (!dev || resno < 0 || resno > PCI_ROM_RESOURCE)
		return;
	r = &dev->resource[resno];
	if (!ng_traceable(r))
		return;
	ng_lock_irqsave(&flags);
	f = ng_find_filter(r->start, resource_size(r));
	if (f && f->start == r->start && f->size == resource_size(r)) {
		for (i = 0; i < NG_MOVING; i++) {
			if (ng_moving[i].dev == dev && ng_moving[i].resno == resno) {
				slot = i;
				break;
			}
			if (!ng_moving[i].dev && slot == NG_MOVING)
				slot = i;
		}
		if (slot < NG_MOVING) {
			if (!ng_moving[slot].dev)
				WRITE_ONCE(ng_nmoving, ng_nmoving + 1);
			ng_moving[slot].dev = dev;
			ng_moving[slot].resno = resno;
			ng_moving[slot].start = r->start;
			ng_moving[slot].size = resource_size(r);
		}
	}
	ng_unlock_irqrestore(flags);
	if (slot == NG_MOVING && f)
		pr_warn_ratelimited("too many BARs moving at once: one is not followed\n");
}

/* The move of dev's BAR resno noted at its release, taken off the list. */
static bool ng_moving_take(const struct pci_dev *dev, int resno, struct ng_moving *mv)
{
	unsigned long flags;
	unsigned int i;
	bool found = false;

	ng_lock_irqsave(&flags);
	for (i = 0; i < NG_MOVING && !found; i++) {
		if (ng_moving[i].dev != dev || ng_moving[i].resno != resno)
			continue;
		*mv = ng_moving[i];
		ng_moving[i].dev = NULL;
		WRITE_ONCE(ng_nmoving, ng_nmoving - 1);
		found = true;
	}
	ng_unlock_irqrestore(flags);
	return found;
}

/* dev's BAR resno was assigned anew: its filter follows it.  Process context. */
static void ng_follow_bar(struct pci_dev *dev, int resno)
{
	const struct resource *r;
	struct ng_moving mv;
	unsigned int tries;

	if (resno < 0 || resno > PCI_ROM_RESOURCE || !ng_moving_take(dev, resno, &mv))
		return;
	r = &dev->resource[resno];
	/*
	 * Following sleeps (a grace period, an allocation): only where the
	 * caller may sleep, which every caller seen does (without
	 * CONFIG_PREEMPT_COUNT a held spinlock cannot be told).
	 */
	if (IS_ENABLED(CONFIG_PREEMPT_COUNT) && !preemptible())
		goto not_followed;
	for (tries = 0; !mutex_trylock(&ng_mutex); tries++) {
		if (tries == 100)
			goto not_followed;
		usleep_range(1000, 2000);
	}
	if (ng_traceable(r))
		ng_filter_move(mv.start, mv.size, r->start, resource_size(r));
	else
		ng_filters_drop(mv.start, mv.size);
	mutex_unlock(&ng_mutex);
	return;
not_followed:
	/* the old range keeps its filter: only the device is gone from it */
	ng_report_map(0, r->start, resource_size(r), -ETIMEDOUT);
}

/* Runs in place of pci_assign_resource() while a traced BAR is moving. */
static int ng_pci_assign_resource(struct pci_dev *dev, int resno)
{
	int ret = pci_assign_resource(dev, resno);

	if (!ret)
		ng_follow_bar(dev, resno);
	atomic_dec(&ng_assign_inflight);
	return ret;
}

static void notrace ng_assign_ftrace(unsigned long ip, unsigned long parent_ip,
				     struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	struct pt_regs *regs = ftrace_get_regs(fregs);

	/* the wrapper's own call of it, or nothing moving: as it is */
	if (!regs || !READ_ONCE(ng_nmoving) || within_module(parent_ip, THIS_MODULE))
		return;
	atomic_inc(&ng_assign_inflight);
	instruction_pointer_set(regs, (unsigned long)ng_pci_assign_resource);
}

static struct ftrace_ops ng_release_ops = {
	.func = ng_release_ftrace,
	.flags = FTRACE_OPS_FL_SAVE_REGS,
};

static struct ftrace_ops ng_assign_ops = {
	.func = ng_assign_ftrace,
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY,
};

static void ng_moves_hook(void)
{
	if (ng_ftrace_hook(&ng_release_ops, "pci_release_resource"))
		goto fail;
	if (ng_ftrace_hook(&ng_assign_ops, "pci_assign_resource")) {
		ng_ftrace_unhook(&ng_release_ops);
		goto fail;
	}
	ng_moves_hooked = true;
	return;
fail:
	pr_warn("a traced BAR that moves (a resize) will not be followed\n");
}

static void ng_moves_unhook(void)
{
	if (!ng_moves_hooked)
		return;
	ng_ftrace_unhook(&ng_assign_ops);
	ng_ftrace_unhook(&ng_release_ops);
	/* bounded: pci_assign_resource() returns, ng_follow_bar() gives up */
	while (atomic_read(&ng_assign_inflight))
		usleep_range(1000, 2000);
	/* a task preempted between the count's decrement and its return */
	synchronize_rcu_tasks();
	ng_moves_hooked = false;
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
	int ret = bus_register_notifier(&pci_bus_type, &ng_pci_nb);

	if (!ret)
		ng_moves_hook();
	return ret;
}

void ng_pci_exit(void)
{
	ng_moves_unhook();
	bus_unregister_notifier(&pci_bus_type, &ng_pci_nb);
}
