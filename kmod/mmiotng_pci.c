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
 * the BAR (pci_release_resource: its range is noted, ng_moving) and places
 * it anew (pci_assign_resource, or pci_claim_resource where a failed
 * resize puts it back; each called through a wrapper of the helper while a
 * move is noted); the filter then moves to the new range before the
 * caller can map it, said with -EXDEV (ng_follow_bar).  The moves noted
 * are forgotten when their device is removed or the session ends.
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
 *    move in ng_moving, under ng_lock.  The wrappers of
 *    pci_assign/claim_resource() run in their callers' context (process
 *    context in every caller: probe, sysfs, the PCI core's resource code,
 *    holding the rescan lock, the device lock or pci_bus_sem, none of
 *    which a holder of ng_mutex waits for) and take ng_mutex to move the
 *    filter; where they may not sleep they say the move was not followed.
 *    Module exit unhooks them and waits for the wrappers that run
 *    (ng_follow_inflight), then for every task to have left the module's
 *    code (RCU Tasks).
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
	ng_moving_clear(pdev);
}

/* ---- BARs that move ---------------------------------------------- */

/* A traced BAR released, to be assigned (or claimed) anew: ng_lock. */
struct ng_moving {
	const struct pci_dev *dev;	/* compared, never used */
	int resno;
	phys_addr_t start;
	u64 size;
};

#define NG_MOVING	16	/* a resize releases every BAR of its device */
static struct ng_moving ng_moving[NG_MOVING];
static unsigned int ng_nmoving;	/* entries in use; read without the lock */
static atomic_t ng_follow_inflight = ATOMIC_INIT(0);
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
	bool traced;
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
	traced = f && f->start == r->start && f->size == resource_size(r);
	for (i = 0; traced && i < NG_MOVING; i++) {
		if (ng_moving[i].dev == dev && ng_moving[i].resno == resno) {
			slot = i;
			break;
		}
		if (!ng_moving[i].dev && slot == NG_MOVING)
			slot = i;
	}
	if (traced && slot < NG_MOVING) {
		if (!ng_moving[slot].dev)
			WRITE_ONCE(ng_nmoving, ng_nmoving + 1);
		ng_moving[slot].dev = dev;
		ng_moving[slot].resno = resno;
		ng_moving[slot].start = r->start;
		ng_moving[slot].size = resource_size(r);
	}
	ng_unlock_irqrestore(flags);
	if (traced && slot == NG_MOVING)
		pr_warn_ratelimited("too many traced BARs moving at once: one is not followed\n");
}

/*
 * Copy the entries of dev (every entry if dev is NULL) and of its BAR
 * resno (every BAR if resno < 0) to out, up to n; take them off if take.
 */
static unsigned int ng_moving_get(const struct pci_dev *dev, int resno, bool take,
				  struct ng_moving *out, unsigned int n)
{
	unsigned int i, got = 0;
	unsigned long flags;

	ng_lock_irqsave(&flags);
	for (i = 0; i < NG_MOVING && got < n; i++) {
		struct ng_moving *e = &ng_moving[i];

		if (!e->dev || (dev && e->dev != dev) || (resno >= 0 && e->resno != resno))
			continue;
		out[got++] = *e;
		if (take) {
			e->dev = NULL;
			WRITE_ONCE(ng_nmoving, ng_nmoving - 1);
		}
	}
	ng_unlock_irqrestore(flags);
	return got;
}

/*
 * Forget the moves of dev's BARs (every move if dev is NULL: the session
 * ends); a removed device's released BARs lose their filters, said as for
 * its other BARs.  ng_mutex held.
 */
void ng_moving_clear(const struct pci_dev *dev)
{
	struct ng_moving gone[NG_MOVING];
	unsigned int i, n;

	lockdep_assert_held(&ng_mutex);
	n = ng_moving_get(dev, -1, true, gone, NG_MOVING);
	for (i = 0; dev && i < n; i++)
		ng_filters_drop(gone[i].start, gone[i].size);
}

/* Whether the caller may sleep: a grace period, an allocation. */
static bool ng_may_sleep(void)
{
	/* without CONFIG_PREEMPT_COUNT a held spinlock cannot be told */
	return !IS_ENABLED(CONFIG_PREEMPT_COUNT) ||
	       (preemptible() && !rcu_preempt_depth());
}

/*
 * dev's BAR resno was assigned or claimed where its resource says: the
 * filter on its old range moves there, and the trace says so (-EXDEV,
 * virt: the new start, or 0 and a record of the new range with why).
 * BARs of the device released with it and not placed yet lose their old
 * filters if the new range covers them (each follows when it is placed).
 * Process context, in the caller of pci_assign/claim_resource(), which
 * may hold the PCI rescan lock, the device lock or pci_bus_sem: ng_mutex
 * comes after each of those everywhere.
 */
static void ng_follow_bar(struct pci_dev *dev, int resno)
{
	const struct resource *r = &dev->resource[resno];
	struct ng_moving mv, others[NG_MOVING];
	unsigned int i, n;
	int ret;

	if (!ng_moving_get(dev, resno, true, &mv, 1))
		return;
	if (ng_traceable(r) && r->start == mv.start && resource_size(r) == mv.size)
		return;		/* back where it was: its filter is there */
	if (!ng_may_sleep()) {
		ng_report_map(0, ng_traceable(r) ? r->start : mv.start,
			      ng_traceable(r) ? resource_size(r) : mv.size, -EAGAIN);
		return;
	}
	mutex_lock(&ng_mutex);
	ng_filter_remove(mv.start, mv.size);
	if (!ng_traceable(r)) {
		ng_report_map(0, mv.start, mv.size, -EXDEV);
		goto out;
	}
	n = ng_moving_get(dev, -1, false, others, NG_MOVING);
	for (i = 0; i < n; i++)
		if (others[i].start <= r->end && r->start < others[i].start + others[i].size)
			ng_filter_remove(others[i].start, others[i].size);
	ret = ng_filter_insert(r->start, resource_size(r));
	ng_report_map(ret ? 0 : r->start, mv.start, mv.size, -EXDEV);
	if (ret)
		ng_report_map(0, r->start, resource_size(r), ret);
out:
	mutex_unlock(&ng_mutex);
}

/* These run in place of pci_assign/claim_resource() while a BAR moves. */
static int ng_pci_assign_resource(struct pci_dev *dev, int resno)
{
	int ret = pci_assign_resource(dev, resno);

	if (!ret && resno >= 0 && resno <= PCI_ROM_RESOURCE)
		ng_follow_bar(dev, resno);
	atomic_dec(&ng_follow_inflight);
	return ret;
}

static int ng_pci_claim_resource(struct pci_dev *dev, int resno)
{
	int ret = pci_claim_resource(dev, resno);

	if (!ret && resno >= 0 && resno <= PCI_ROM_RESOURCE)
		ng_follow_bar(dev, resno);
	atomic_dec(&ng_follow_inflight);
	return ret;
}

/* The call goes to func instead, unless it is func's own call or nothing moves. */
static void notrace ng_redirect(struct ftrace_regs *fregs, unsigned long parent_ip,
				void *func)
{
	struct pt_regs *regs = ftrace_get_regs(fregs);

	if (!regs || !READ_ONCE(ng_nmoving) || within_module(parent_ip, THIS_MODULE))
		return;
	atomic_inc(&ng_follow_inflight);
	instruction_pointer_set(regs, (unsigned long)func);
}

static void notrace ng_assign_ftrace(unsigned long ip, unsigned long parent_ip,
				     struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	ng_redirect(fregs, parent_ip, ng_pci_assign_resource);
}

static void notrace ng_claim_ftrace(unsigned long ip, unsigned long parent_ip,
				    struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	ng_redirect(fregs, parent_ip, ng_pci_claim_resource);
}

static struct ftrace_ops ng_release_ops = {
	.func = ng_release_ftrace,
	.flags = FTRACE_OPS_FL_SAVE_REGS,
};

static struct ftrace_ops ng_assign_ops = {
	.func = ng_assign_ftrace,
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY,
};

static struct ftrace_ops ng_claim_ops = {
	.func = ng_claim_ftrace,
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY,
};

static void ng_moves_hook(void)
{
	if (ng_ftrace_hook(&ng_release_ops, "pci_release_resource"))
		goto fail;
	if (ng_ftrace_hook(&ng_assign_ops, "pci_assign_resource"))
		goto fail_release;
	if (ng_ftrace_hook(&ng_claim_ops, "pci_claim_resource"))
		goto fail_assign;
	ng_moves_hooked = true;
	return;
fail_assign:
	ng_ftrace_unhook(&ng_assign_ops);
fail_release:
	ng_ftrace_unhook(&ng_release_ops);
fail:
	pr_warn("a traced BAR that moves (a resize) will not be followed\n");
}

static void ng_moves_unhook(void)
{
	if (!ng_moves_hooked)
		return;
	ng_ftrace_unhook(&ng_claim_ops);
	ng_ftrace_unhook(&ng_assign_ops);
	ng_ftrace_unhook(&ng_release_ops);
	/* bounded: the PCI calls return, ng_mutex is held only for bounded work */
	while (atomic_read(&ng_follow_inflight))
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
