// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the session and its commands.
 *
 * One session at a time owns the helper: the generic-netlink socket that
 * sent the first command (ng_session_claim), or the kernel's own mmiotrace
 * (ng_kernel_tracer_start, from mmiotng_hooks.c).  Both claims go through
 * one atomic state, so neither can slip in between the other's check and
 * its start.  When the owning socket is released everything is disarmed.
 * The owner is a port id in a network namespace: port ids are per
 * namespace, and any user can make a socket with the owner's port id in a
 * namespace of their own (its release must not end the session).
 *
 * The ioremap and iounmap probes are kprobes, which can be switched off
 * for the whole system (/sys/kernel/debug/kprobes/enabled).  Every command
 * checks that they fire (ng_check_probes; the tracer polls STATUS): if
 * not, the session's tracing stops, everything is disarmed (an entry that
 * an unseen iounmap changed is left alone, mmiotng_pages.c), a MARK in
 * the trace says why, and no session can add anything until they are on.
 * What happened between the switch and the check is not traced.
 *
 * Locking in this file:
 *  - Every function here except the kernel-tracer pair and ng_get_stats
 *    runs in process context with ng_mutex held (netlink commands, socket
 *    release, module exit).
 *  - ng_state is changed with atomic_cmpxchg only; ng_owner, ng_owner_net
 *    and ng_probes_off under ng_mutex.  ng_owner_net is only compared,
 *    never dereferenced: the owner's socket keeps its namespace alive
 *    until its release, which ends the session.
 *  - The filter and mapping lists change under ng_mutex and ng_lock; a
 *    filter is unlinked together with its mappings in one ng_lock section,
 *    so an ioremap returning meanwhile (mmiotng_probes.c) no longer finds
 *    it, and freed after synchronize_rcu() and ng_wait_steps().
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/delay.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/rculist.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/vmalloc.h>
#include <net/net_namespace.h>

#include "mmiotng.h"
#include "mmiotng_trace.h"

DEFINE_MUTEX(ng_mutex);		/* see the locking rules in mmiotng.h */
static atomic_t ng_state = ATOMIC_INIT(NG_IDLE);
static u32 ng_owner;		/* netlink port id of the session; ng_mutex */
static const struct net *ng_owner_net;	/* and its namespace; ng_mutex */
static bool ng_probes_off;	/* the last check found them off; ng_mutex */

#define NG_PROBES_OFF_NOTE \
	"mmiotrace-ng: kprobes are disabled (/sys/kernel/debug/kprobes/enabled is 0): " \
	"ioremap and iounmap are not seen; tracing stopped, everything disarmed"

/* the MARK's text: MMIOTNG_MARK_TP's readers read MMIOTNG_MARK_MAX bytes */
static char ng_note[MMIOTNG_MARK_MAX + 1] = NG_PROBES_OFF_NOTE;
/* ng_probes_missed() at the last check, and the MARK that says more; ng_mutex */
static unsigned long ng_missed_seen;
static char ng_missed_note[MMIOTNG_MARK_MAX + 1];

/* ---- the session ---------------------------------------------------- */

/*
 * Make portid the owner.  -EBUSY if another socket owns the session,
 * -EALREADY if the kernel's own mmiotrace runs.  ng_mutex held.
 */
int ng_session_claim(u32 portid, const struct net *net)
{
	int old;

	lockdep_assert_held(&ng_mutex);
	old = atomic_cmpxchg(&ng_state, NG_IDLE, NG_TRACER);
	if (old == NG_IDLE) {
		ng_owner = portid;
		ng_owner_net = net;
		return 0;
	}
	if (old == NG_TRACER)
		return ng_owner == portid && net_eq(ng_owner_net, net) ? 0 : -EBUSY;
	return -EALREADY;
}

/* End the session of portid in net: disarm everything.  ng_mutex held. */
bool ng_session_release(u32 portid, const struct net *net)
{
	lockdep_assert_held(&ng_mutex);
	if (atomic_read(&ng_state) != NG_TRACER || ng_owner != portid ||
	    !net_eq(ng_owner_net, net))
		return false;
	ng_disarm_all();
	ng_owner = 0;
	ng_owner_net = NULL;
	atomic_set(&ng_state, NG_IDLE);
	return true;
}

/*
 * Calls of ioremap and iounmap the probes missed since the last check are
 * said in the trace (their mappings are not traced, or not disarmed by the
 * probe).  ng_mutex held.
 */
static void ng_note_missed(void)
{
	unsigned long missed = ng_probes_missed();

	if (missed == ng_missed_seen)
		return;
	if (atomic_read(&ng_state) == NG_TRACER) {
		snprintf(ng_missed_note, sizeof(ng_missed_note),
			 "mmiotrace-ng: the helper's ioremap/iounmap probes missed %lu calls: mappings made or unmapped then are NOT traced",
			 missed - ng_missed_seen);
		trace_mmiotng_mark(ng_missed_note, strlen(ng_missed_note));
	}
	ng_missed_seen = missed;
}

/*
 * Whether the ioremap and iounmap probes fire (see the top of this file).
 * When a check first finds them off during a session, that session's
 * tracing stops.  ng_mutex held.
 */
bool ng_check_probes(void)
{
	bool was_off = ng_probes_off;

	lockdep_assert_held(&ng_mutex);
	ng_note_missed();
	ng_probes_off = !ng_probes_alive();
	if (!ng_probes_off || was_off || atomic_read(&ng_state) != NG_TRACER)
		return !ng_probes_off;
	ng_disarm_all();
	pr_warn("kprobes are disabled: ioremap and iounmap are not seen; tracing stopped, everything disarmed\n");
	trace_mmiotng_mark(ng_note, strlen(ng_note));
	return false;
}

bool ng_probes_were_off(void)
{
	lockdep_assert_held(&ng_mutex);
	return ng_probes_off;
}

u32 ng_session_owner(void)
{
	return atomic_read(&ng_state) == NG_TRACER ? READ_ONCE(ng_owner) : 0;
}

/* The kernel's mmiotrace starts: false if a session owns the helper. */
bool ng_kernel_tracer_start(void)
{
	int old = atomic_cmpxchg(&ng_state, NG_IDLE, NG_KERNEL_TRACER);

	return old == NG_IDLE || old == NG_KERNEL_TRACER;
}

void ng_kernel_tracer_stop(void)
{
	atomic_cmpxchg(&ng_state, NG_KERNEL_TRACER, NG_IDLE);
}

/* ---- filters -------------------------------------------------------- */

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

void ng_disarm_all(void)
{
	lockdep_assert_held(&ng_mutex);
	ng_trace_new_devices(false);
	ng_moving_clear(NULL);
	ng_teardown(NULL);
	WRITE_ONCE(ng_mode, MMIOTNG_MODE_EMULATE);
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

/* ---- mode and counters ---------------------------------------------- */

static bool test_modes;
module_param(test_modes, bool, 0444);
MODULE_PARM_DESC(test_modes,
		 "allow MMIOTNG_MODE_TRAP_ONLY (benchmarks: accesses are skipped, not made)");

int ng_set_mode(u32 mode)
{
	switch (mode) {
	case MMIOTNG_MODE_EMULATE:
	case MMIOTNG_MODE_SINGLESTEP:
		break;
	case MMIOTNG_MODE_TRAP_ONLY:
		if (!test_modes)
			return -EPERM;
		break;
	default:
		return -EINVAL;
	}
	WRITE_ONCE(ng_mode, mode);
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

void ng_get_stats(struct ng_stats *sum)
{
	int cpu;

	memset(sum, 0, sizeof(*sum));
	for_each_possible_cpu(cpu) {
		const struct ng_stats *s = per_cpu_ptr(&ng_stats, cpu);

		sum->armed_pages += s->armed_pages;
		sum->faults += s->faults;
		sum->emulated += s->emulated;
		sum->singlestepped += s->singlestepped;
		sum->unknown += s->unknown;
		sum->refused += s->refused;
		sum->retried += s->retried;
		sum->stale += s->stale;
	}
}
