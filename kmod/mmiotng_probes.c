// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the ioremap and iounmap probes.
 *
 * - A kretprobe on __ioremap_caller() arms every new mapping of a filtered
 *   range before ioremap returns it to the driver.
 * - An ftrace ops at iounmap() entry restores the pages of an armed mapping
 *   before vunmap clears them, and marks the address as being unmapped; a
 *   kretprobe on iounmap() clears the mark when the unmap is complete.
 *   The entry hook is an ftrace ops, PERMANENT as the fault hook, not a
 *   kprobe: switching kprobes off (debugfs) must not let a mapping be
 *   unmapped unseen.  vunmap does not clear an armed 2M entry (it is
 *   "none" to pmd_none() and not huge to pmd_clear_huge()), so a disarm
 *   after an unseen unmap could not tell it from a live one.
 *   ARM_EXISTING refuses an address with a mark: between iounmap's entry
 *   and the end of vunmap the entries it would save are about to be freed,
 *   and writing them back later would corrupt the page table.
 *
 * Locking in this file:
 *  - The handlers run in probe context (preemption off), the iounmap
 *    entry hook in iounmap's caller's (ftrace), on any CPU at once; they
 *    never sleep and never print.  They take ng_lock (irqsave)
 *    for every look at the filter and mapping lists and the marks.  The
 *    ioremap probe allocates only when its filter's spares are used up,
 *    GFP_NOWAIT, outside the lock, and never on PREEMPT_RT.
 *  - A mark that the kretprobe misses (no free instance) stays: that only
 *    refuses ARM_EXISTING at that address, it never lets an arm through.
 *    Marks that do not fit in the table are counted in ng_unmap_overflow,
 *    which refuses every ARM_EXISTING while it is not zero.
 *  - The mapping an iounmap disarms is kept as a spare or freed after an
 *    RCU grace period (call_rcu): the fault path may still be looking at it.
 *  - ng_probes_alive() may run anywhere but in a probe handler, on any CPU
 *    at once: the canary's hits are an atomic count, and while the kprobes
 *    are off nothing counts, so a concurrent call can only make a "yes"
 *    that is true anyway.
 *  - The iounmap hook marks an address only while the kprobes fire: the
 *    kretprobe that takes the mark away must see the same call (a mark
 *    made while they are off would stay for ever).  While they are off no
 *    session arms anything (ng_check_probes), so no mark is needed then.
 *
 * Writing 0 to /sys/kernel/debug/kprobes/enabled disarms every kprobe at
 * once and tells nobody: no flag of the kprobe changes (kprobe_disabled()
 * stays false), and kprobes_all_disarmed is not exported.  So the helper
 * keeps a kprobe of its own on ng_probe_canary(), disarmed and armed again
 * with all the others, and calls it: if its handler does not run, the
 * ioremap and iounmap probes do not either (mmiotng_ctl.c, ng_check_probes).
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ftrace.h>
#include <linux/kprobes.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>
#include <linux/mm.h>
#include <linux/cpumask.h>
#include <linux/delay.h>

#include "mmiotng.h"

#define NG_UNMAP_SLOTS		32

static unsigned long ng_unmap_slot[NG_UNMAP_SLOTS];	/* ng_lock */
static unsigned int ng_unmap_overflow;			/* ng_lock */

/*
 * Whether the area [base, base + len), a whole ioremap area
 * (ng_whole_area), may be being unmapped: iounmap() frees the area that
 * holds the address it is given, its start or not, or whose guard page
 * (base + len) it is.  ng_lock held.
 */
bool ng_unmap_in_flight(unsigned long base, unsigned long len)
{
	unsigned int i;

	ng_lock_assert_held();
	if (ng_unmap_overflow)
		return true;
	for (i = 0; i < NG_UNMAP_SLOTS; i++) {
		unsigned long a = ng_unmap_slot[i];

		if (a && a - base <= len)
			return true;
	}
	return false;
}

static void ng_unmap_mark(unsigned long base)
{
	unsigned int i;

	for (i = 0; i < NG_UNMAP_SLOTS; i++) {
		if (!ng_unmap_slot[i]) {
			ng_unmap_slot[i] = base;
			return;
		}
	}
	ng_unmap_overflow++;
}

static void ng_unmap_unmark(unsigned long base)
{
	unsigned int i;

	for (i = 0; i < NG_UNMAP_SLOTS; i++) {
		if (ng_unmap_slot[i] == base) {
			ng_unmap_slot[i] = 0;
			return;
		}
	}
	if (ng_unmap_overflow)
		ng_unmap_overflow--;
}

/* ---- ioremap ------------------------------------------------------- */

struct ng_ioremap_args {
	phys_addr_t phys;
	unsigned long size;
};

static int test_maxactive;
module_param(test_maxactive, int, 0444);
MODULE_PARM_DESC(test_maxactive,
		 "tests: kretprobe instances of the ioremap probe, each held 1 ms longer (calls on two CPUs then overlap, and the probe misses some)");

static int ng_ioremap_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ng_ioremap_args *a = (void *)ri->data;

	a->phys = regs_get_kernel_argument(regs, 0);
	a->size = regs_get_kernel_argument(regs, 1);
	if (test_maxactive > 0)
		mdelay(1);
	return 0;
}

/*
 * Whether a new mapping of [phys, phys + size) is for a filter: 0 if one
 * contains it, -ENOENT if it only overlaps one (not traced), 1 if neither.
 */
static int ng_wanted(phys_addr_t phys, unsigned long size)
{
	unsigned long flags;
	int wanted = 1;

	ng_lock_irqsave(&flags);
	if (ng_find_filter(phys, size))
		wanted = 0;
	else if (ng_overlaps_filter(phys, size))
		wanted = -ENOENT;
	ng_unlock_irqrestore(flags);
	return wanted;
}

/* A mapping of a traced range stays unarmed: counted and reported. */
static void ng_refuse(unsigned long virt, phys_addr_t phys, unsigned long size, int err)
{
	this_cpu_inc(ng_stats.refused);
	ng_report_map(virt, phys, size, err);
}

/*
 * Arm the new mapping [virt, virt + a->size) in *extra if there is one
 * (*extra is then used: NULL), else in a spare of its filter.  -ENOMEM: no
 * extra and no spare; -EFBIG: it needs more entries than a spare has;
 * -ENOENT: no filter wants it any more; -EEXIST: ARM_EXISTING armed it
 * meanwhile (traced).  ng_lock held.
 */
static int ng_arm_new(unsigned long virt, const struct ng_ioremap_args *a,
		      struct ng_mapping **extra)
{
	unsigned long base = virt & PAGE_MASK;
	unsigned long len = PAGE_ALIGN((virt & ~PAGE_MASK) + a->size);
	struct ng_filter *f = ng_find_filter(a->phys, a->size);
	struct ng_mapping *m;
	int ret;

	if (!f)
		return -ENOENT;
	if (ng_overlaps_mapping(base, len))
		return -EEXIST;
	m = *extra ?: ng_spare_get(f);
	if (!m)
		return -ENOMEM;
	ret = ng_mapping_prepare(m, virt, a->phys, a->size);
	if (!ret)
		ret = ng_mapping_arm(m, f);
	if (m == *extra) {
		if (!ret)
			*extra = NULL;
	} else if (ret) {
		ng_spare_put(f, m);
	}
	return ret;
}

/*
 * __ioremap_caller() returned: arm the new mapping before the driver can
 * use it, and report it (its MAP record), or report why it is not traced.
 * Probe context, preemption off: nothing printed; nothing allocated but,
 * outside PREEMPT_RT, a mapping when the filter's spares are used up.
 */
static int ng_ioremap_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ng_ioremap_args *a = (void *)ri->data;
	unsigned long virt = regs_return_value(regs);
	struct ng_mapping *extra = NULL;
	unsigned long flags;
	int ret;

	if (!virt || list_empty(&ng_filters))
		return 0;
	ret = ng_wanted(a->phys, a->size);
	if (ret) {
		if (ret < 0)
			ng_refuse(virt, a->phys, a->size, ret);
		return 0;
	}
	ng_lock_irqsave(&flags);
	ret = ng_arm_new(virt, a, &extra);
	ng_unlock_irqrestore(flags);
	if (ret == -ENOMEM || ret == -EFBIG) {
		/*
		 * Again with one of its own, of the mapping's size, when the
		 * spares are used up (or a spare that came back meanwhile) or
		 * too small for it; without one, the error stays.
		 */
		extra = ng_mapping_atomic(virt, a->size);
		ng_lock_irqsave(&flags);
		ret = ng_arm_new(virt, a, &extra);
		ng_unlock_irqrestore(flags);
		ng_mapping_free(extra);		/* NULL when it was used */
	}
	if (ret == -ENOENT || ret == -EEXIST)
		return 0;			/* not wanted now, or traced already */
	if (ret) {
		ng_refuse(virt, a->phys, a->size, ret);
		return 0;
	}
	ng_report_map(virt, a->phys, a->size, 0);
	if (irqs_disabled())
		ng_flush_soon();
	else
		ng_flush_all();
	return 0;
}

static struct kretprobe ng_ioremap_probe = {
	.kp.symbol_name = "__ioremap_caller",
	.entry_handler = ng_ioremap_entry,
	.handler = ng_ioremap_ret,
	.data_size = sizeof(struct ng_ioremap_args),
};

/* ---- iounmap ------------------------------------------------------- */

/*
 * The armed mapping of the area that iounmap(base) frees, or NULL.  iounmap()
 * frees the area that holds base, which may be inside it (a driver's bug)
 * or its guard page; every armed mapping is all of its area but the guard
 * (ng_whole_area).  ng_lock held.
 */
static struct ng_mapping *ng_unmapped_mapping(unsigned long base)
{
	struct ng_mapping *m = ng_find_mapping(base);

	if (m)
		return m;
	m = ng_find_mapping(base - PAGE_SIZE);
	return m && m->base + m->len == base ? m : NULL;
}

/*
 * iounmap() entry: put the pages back before the area is freed.  From the
 * ftrace hook (p is NULL): process context, preemption possibly on; all it
 * does is under ng_lock with interrupts off.
 */
static int ng_iounmap_pre(struct kprobe *p, struct pt_regs *regs)
{
	unsigned long base = regs_get_kernel_argument(regs, 0) & PAGE_MASK;
	bool mark = ng_probes_alive();
	struct ng_mapping *m;
	unsigned long flags;

	ng_lock_irqsave(&flags);
	if (mark)
		ng_unmap_mark(base);
	m = ng_unmapped_mapping(base);
	if (m)
		ng_mapping_disarm(m);
	ng_unlock_irqrestore(flags);
	if (m)
		call_rcu(&m->rcu, ng_mapping_recycle);
	return 0;
}

static void notrace ng_iounmap_ftrace(unsigned long ip, unsigned long parent_ip,
				      struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	struct pt_regs *regs = ftrace_get_regs(fregs);

	if (regs)
		ng_iounmap_pre(NULL, regs);
}

static struct ftrace_ops ng_iounmap_ops = {
	.func = ng_iounmap_ftrace,
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_PERMANENT,
};

static int ng_iounmap_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	*(unsigned long *)ri->data = regs_get_kernel_argument(regs, 0) & PAGE_MASK;
	return 0;
}

/* iounmap() returned: the entries are gone, the mark can go. */
static int ng_iounmap_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	unsigned long flags;

	ng_lock_irqsave(&flags);
	ng_unmap_unmark(*(unsigned long *)ri->data);
	ng_unlock_irqrestore(flags);
	return 0;
}

static struct kretprobe ng_iounmap_done_probe = {
	.kp.symbol_name = "iounmap",
	.entry_handler = ng_iounmap_entry,
	.handler = ng_iounmap_ret,
	.data_size = sizeof(unsigned long),
};

/* ---- whether kprobes fire ------------------------------------------- */

static atomic_long_t ng_canary_hits = ATOMIC_LONG_INIT(0);

/*
 * notrace: its kprobe is a breakpoint, not an ftrace site, so that it also
 * fires when called from the iounmap hook, an ftrace callback (ftrace's
 * recursion guard could skip a nested ftrace-based probe).  The kprobes
 * switch disarms both kinds alike.
 */
static noinline notrace void ng_probe_canary(void)
{
	asm volatile("");	/* a call the compiler keeps */
}

static int ng_canary_pre(struct kprobe *p, struct pt_regs *regs)
{
	atomic_long_inc(&ng_canary_hits);
	return 0;
}

static struct kprobe ng_canary_probe = {
	.pre_handler = ng_canary_pre,
};

/* Whether the helper's kprobes fire now.  Not from a probe handler. */
bool ng_probes_alive(void)
{
	long before = atomic_long_read(&ng_canary_hits);

	ng_probe_canary();
	return atomic_long_read(&ng_canary_hits) != before;
}

/*
 * Calls of ioremap and iounmap the probes missed: no free kretprobe
 * instance (maxactive), or a hit inside another probe's handler.  A missed
 * ioremap is a mapping not armed, a missed iounmap one not disarmed when
 * it went (its entries are then left alone: ng_page_restore).  Any context.
 */
unsigned long ng_probes_missed(void)
{
	return READ_ONCE(ng_ioremap_probe.nmissed) + READ_ONCE(ng_ioremap_probe.kp.nmissed);
}

int ng_probes_init(void)
{
	int maxactive = max_t(int, 64, 4 * num_possible_cpus());
	int ret;

	ng_ioremap_probe.maxactive = test_maxactive > 0 ? test_maxactive : maxactive;
	ng_iounmap_done_probe.maxactive = maxactive;
	ng_canary_probe.addr = (kprobe_opcode_t *)ng_probe_canary;
	ret = register_kprobe(&ng_canary_probe);
	if (ret) {
		pr_err("cannot probe the helper's own canary: %d\n", ret);
		return ret;
	}
	ret = ng_ftrace_hook(&ng_iounmap_ops, "iounmap");
	if (ret)
		goto err_canary;
	ret = register_kretprobe(&ng_iounmap_done_probe);
	if (ret) {
		pr_err("cannot probe the return of iounmap: %d\n", ret);
		goto err_unmap;
	}
	ret = register_kretprobe(&ng_ioremap_probe);
	if (ret) {
		pr_err("cannot probe %s: %d\n", ng_ioremap_probe.kp.symbol_name, ret);
		goto err_done;
	}
	return 0;

err_done:
	unregister_kretprobe(&ng_iounmap_done_probe);
err_unmap:
	ng_ftrace_unhook(&ng_iounmap_ops);
err_canary:
	unregister_kprobe(&ng_canary_probe);
	return ret;
}

/* After everything was disarmed (ng_disarm_all). */
void ng_probes_exit(void)
{
	unregister_kretprobe(&ng_ioremap_probe);
	unregister_kretprobe(&ng_iounmap_done_probe);
	ng_ftrace_unhook(&ng_iounmap_ops);
	unregister_kprobe(&ng_canary_probe);
}
