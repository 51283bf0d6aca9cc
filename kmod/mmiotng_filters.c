// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the filters (the physical ranges a session traces) and the
 * mappings armed in them: add, delete, drop a gone device's, tear down;
 * the mappings made before the session armed (ARM_EXISTING).
 *
 * This file is below the session (mmiotng_ctl.c) and the PCI events
 * (mmiotng_pci.c), which both call it; it calls neither.
 *
 * Locking in this file:
 *  - Every function here but ng_nr_mappings() runs in process context with
 *    ng_mutex held (netlink commands, the PCI bus notifier and the BAR-move
 *    wrappers, socket release, module exit); ng_nr_mappings() walks the
 *    mapping list under RCU.
 *  - The filter and mapping lists change under ng_mutex and ng_lock; a
 *    filter is unlinked together with its mappings in one ng_lock section,
 *    so an ioremap returning meanwhile (mmiotng_probes.c) no longer finds
 *    it, and freed after synchronize_rcu() and ng_wait_steps().
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/minmax.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/rculist.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "mmiotng.h"

/* Whether [start, start + size) lies inside one memory BAR or ROM of a PCI device. */
static bool ng_in_pci_bar(phys_addr_t start, u64 size)
{
	phys_addr_t last = start + size - 1;
	struct pci_dev *pdev = NULL;
	int i;

	for_each_pci_dev(pdev) {
		for (i = 0; i <= PCI_ROM_RESOURCE; i++) {
			const struct resource *r = &pdev->resource[i];

			if (resource_type(r) != IORESOURCE_MEM || !resource_size(r) ||
			    (r->flags & IORESOURCE_UNSET))
				continue;
			if (start >= r->start && last <= r->end) {
				pci_dev_put(pdev);
				return true;
			}
		}
	}
	return false;
}

unsigned int ng_nr_filters(void)
{
	struct ng_filter *f;
	unsigned int n = 0;

	list_for_each_entry(f, &ng_filters, node)
		n++;
	return n;
}

/* A filter on a range known to be a PCI device's BAR.  ng_mutex held. */
int ng_filter_insert(phys_addr_t start, u64 size)
{
	struct ng_filter *f;
	unsigned long flags;

	lockdep_assert_held(&ng_mutex);
	if (!size || size > NG_MAX_FILTER_SIZE || start + size < start)
		return -EINVAL;
	if (ng_nr_filters() >= NG_MAX_FILTERS)
		return -ENOSPC;
	if (ng_overlaps_filter(start, size))
		return -EEXIST;
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	f->start = start;
	f->size = size;
	f->page_len = PAGE_ALIGN(start + size) - (start & PAGE_MASK);
	if (ng_spares_init(f)) {
		kfree(f);
		return -ENOMEM;
	}
	ng_lock_irqsave(&flags);
	list_add_tail(&f->node, &ng_filters);
	ng_unlock_irqrestore(flags);
	return 0;
}

int ng_filter_add(phys_addr_t start, u64 size)
{
	lockdep_assert_held(&ng_mutex);
	if (!size || start + size < start)
		return -EINVAL;
	/* device memory of a PCI device only: not RAM, not page 0, not the HPET */
	if (!ng_in_pci_bar(start, size))
		return -EINVAL;
	return ng_filter_insert(start, size);
}

static unsigned int test_reset_delay_ms;
module_param(test_reset_delay_ms, uint, 0444);
MODULE_PARM_DESC(test_reset_delay_ms,
		 "tests: sleep this long before the windows are reset at a session's end (as a preemption there would)");

/*
 * Unlink filter @only (every filter if NULL) and its mappings in one
 * ng_lock section, restoring their pages; free them once no CPU can be
 * using them.  ng_mutex held.
 */
static void ng_teardown(struct ng_filter *only)
{
	struct ng_mapping *m, *mtmp;
	struct ng_filter *f, *ftmp;
	LIST_HEAD(dead_maps);
	LIST_HEAD(dead_filters);
	unsigned long flags;

	ng_lock_irqsave(&flags);
	list_for_each_entry_safe(f, ftmp, &ng_filters, node) {
		if (only && f != only)
			continue;
		list_del(&f->node);
		f->dying = true;
		list_add(&f->dead, &dead_filters);
	}
	list_for_each_entry_safe(m, mtmp, &ng_mappings, node) {
		if (only && m->filter != only)
			continue;
		ng_mapping_disarm(m);
		list_add(&m->dead, &dead_maps);
	}
	ng_unlock_irqrestore(flags);
	/* no CPU is emulating through them or stepping on them after this */
	synchronize_rcu();
	ng_wait_steps();
	/*
	 * Only with no filter left (ng_filters changes under ng_mutex only):
	 * no mapping is listed then, nor can one be armed.  ng_mappings
	 * empty means nothing: a mapping of another filter can be armed and
	 * emulated through a window the moment after.
	 */
	if (list_empty(&ng_filters)) {
		if (test_reset_delay_ms)
			msleep(min(test_reset_delay_ms, 1000U));
		ng_windows_reset();	/* no device page stays in a window */
	}
	list_for_each_entry_safe(m, mtmp, &dead_maps, dead)
		ng_mapping_free(m);
	/* unmapped mappings on their way back to a dying filter */
	if (!list_empty(&dead_filters))
		rcu_barrier();
	list_for_each_entry_safe(f, ftmp, &dead_filters, dead) {
		ng_spares_free(f);
		kfree(f);
	}
}

int ng_filter_del(phys_addr_t start, u64 size)
{
	struct ng_filter *f;

	lockdep_assert_held(&ng_mutex);
	list_for_each_entry(f, &ng_filters, node) {
		if (f->start == start && f->size == size) {
			ng_teardown(f);
			return 0;
		}
	}
	return -ENOENT;
}

/*
 * Drop every filter in [start, start + size), a BAR of a device that is
 * gone: whatever gets the range next is not the device that was traced.
 * Each is said by a NOT traced record with no address and -ENODEV.
 * ng_mutex held.
 */
void ng_filters_drop(phys_addr_t start, u64 size)
{
	struct ng_filter *f;
	phys_addr_t fstart;
	u64 fsize;

	lockdep_assert_held(&ng_mutex);
again:
	list_for_each_entry(f, &ng_filters, node) {
		if (f->start < start + size && start < f->start + f->size) {
			fstart = f->start;
			fsize = f->size;
			ng_teardown(f);
			ng_report_map(0, fstart, fsize, -ENODEV);
			goto again;	/* ng_teardown() took f off the list */
		}
	}
}

/* Take off the filter on exactly [start, start + size), if any; quietly. */
void ng_filter_remove(phys_addr_t start, u64 size)
{
	struct ng_filter *f = ng_find_filter(start, size);

	lockdep_assert_held(&ng_mutex);
	if (f && f->start == start && f->size == size)
		ng_teardown(f);
}

/* Tear down every filter and its mappings.  ng_mutex held. */
void ng_filters_clear(void)
{
	lockdep_assert_held(&ng_mutex);
	ng_teardown(NULL);
}

/* ---- mappings made before the session ------------------------------- */

/*
 * Arm a mapping made before the session (found in /proc/vmallocinfo).
 * It must be a whole ioremap area, every entry must map the claimed
 * physical range, inside a filter; an address being unmapped right now is
 * refused with -EBUSY.
 */
int ng_arm_existing(unsigned long virt, u64 size, phys_addr_t phys)
{
	struct ng_mapping *m = NULL;
	struct ng_filter *f;
	unsigned long flags;
	int ret;

	lockdep_assert_held(&ng_mutex);
	if (!size || size > NG_MAX_FILTER_SIZE || virt + size < virt ||
	    !is_vmalloc_addr((void *)virt) || !is_vmalloc_addr((void *)(virt + size - 1)) ||
	    (virt & ~PAGE_MASK) != (phys & ~PAGE_MASK) || ng_overlaps_windows(virt, size))
		return -EINVAL;
	f = ng_find_filter(phys, size);
	if (!f)
		ret = -ENOENT;
	else
		m = ng_mapping_alloc(virt, phys, size, &ret);
	if (m) {
		ng_lock_irqsave(&flags);
		if (ng_unmap_in_flight(m->base, m->len))
			ret = -EBUSY;
		else if (ng_overlaps_mapping(m->base, m->len))
			ret = -EEXIST;
		else if (!ng_whole_area(m->base, m->len))
			ret = -EINVAL;
		else
			ret = ng_mapping_arm(m, f);
		ng_unlock_irqrestore(flags);
	}
	/* armed already (by the ioremap probe): traced, nothing to report */
	if (ret != -EEXIST)
		ng_report_map(virt, phys, size, ret);
	if (ret) {
		if (ret != -EEXIST)
			this_cpu_inc(ng_stats.refused);
		if (m)
			ng_mapping_free(m);
		return ret;
	}
	ng_flush_all();
	return 0;
}

unsigned int ng_nr_mappings(void)
{
	struct ng_mapping *m;
	unsigned int n = 0;

	rcu_read_lock();
	list_for_each_entry_rcu(m, &ng_mappings, node)
		n++;
	rcu_read_unlock();
	return n;
}
