// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the records, through the tracepoints mmiotng_access,
 * mmiotng_map and mmiotng_mark (mmiotng_trace.h), where the BPF side
 * attaches raw tracepoint programs.  The fault path (mmiotng_fault.c), the
 * single-step (mmiotng_step.c), the probes and the session report through
 * here; this file calls none of them.
 *
 * Accesses made in NMI-like contexts (an NMI, a kprobe's int3 handler, the
 * debug trap of a single-step: ng_level() > 0) are not traced from there:
 * the tracepoint's BPF program does not run when it interrupted itself on
 * this CPU (the kernel only counts a miss), and the BPF ring buffer only
 * try-locks there.  They wait in a queue per CPU and level for this CPU's
 * irq_work, or its next access in a task or an interrupt, whichever comes
 * first.  A full queue counts them, and the next record that goes out from
 * this CPU says how many were lost.
 *
 * The tracepoints are hit with interrupts off at level 0 too: the irq_work
 * that empties the queues traces from an interrupt, and had it interrupted
 * the same tracepoint's BPF program on this CPU (a MAP record's, in the
 * ioremap probe), BPF would skip the nested run as a recursion: the record
 * (a page given up in an NMI) lost without a word.
 *
 * Locking: a queue is filled only at its level (one context at a time: a
 * context is interrupted only by deeper ones) and emptied only at level 0
 * with interrupts off (the irq_work, the fault path), which the filling
 * context can interrupt but not the reverse: head is published after its
 * record is written, tail moved after its record is copied out.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/irq_work.h>
#include <linux/minmax.h>
#include <linux/percpu.h>
#include <linux/string.h>
#include <linux/timekeeping.h>

#include "mmiotng.h"
#include "ng_decode.h"

#define CREATE_TRACE_POINTS
#include "mmiotng_trace.h"
#define NG_DEFER_RECS	32

#define NG_DEFER_MAPS	4	/* pages given up (ng_untrap): rare */

struct ng_deferred {
	struct mmiotng_access rec[NG_DEFER_RECS];
	unsigned int head;	/* records queued: its level */
	unsigned int tail;	/* records taken: level 0 */
	unsigned int lost;	/* records not queued (full): its level */
	unsigned int lost_said;	/* of them, said in a record: level 0 */
	struct mmiotng_map map[NG_DEFER_MAPS];
	unsigned int map_head, map_tail;	/* as head and tail */
};

/* per CPU, a queue per level above 0 (allocated: too big for a module's static per-CPU area) */
struct ng_deferred_cpu {
	struct ng_deferred q[NG_LEVELS];
};

static struct ng_deferred_cpu __percpu *ng_deferred;
static DEFINE_PER_CPU(struct irq_work, ng_deferred_iw);

/*
 * Counted up by every queueing on this CPU (any level above 0), and the
 * count level 0 last emptied the queues at: equal, nothing is queued, and
 * the fault path does not look at each queue.  A context that queues runs
 * to its end on top of level 0 on the same CPU, so level 0 sees its count
 * only with its records.
 */
static DEFINE_PER_CPU(unsigned int, ng_deferred_gen);
static DEFINE_PER_CPU(unsigned int, ng_deferred_seen);

static void ng_defer(const struct mmiotng_access *a, unsigned int level)
{
	struct ng_deferred *q = &this_cpu_ptr(ng_deferred)->q[level];
	struct mmiotng_access *r;

	if (q->head - READ_ONCE(q->tail) >= NG_DEFER_RECS) {
		WRITE_ONCE(q->lost, q->lost + 1);
	} else {
		r = &q->rec[q->head % NG_DEFER_RECS];
		*r = *a;
		if (!r->ts_ns)
			r->ts_ns = ktime_get_mono_fast_ns();
		/* the record before the head that shows it (one CPU) */
		smp_store_release(&q->head, q->head + 1);
	}
	this_cpu_inc(ng_deferred_gen);
	irq_work_queue(this_cpu_ptr(&ng_deferred_iw));
}

/* A page given up at this level (ng_untrap); the kernel log if no room. */
static void ng_defer_map(const struct mmiotng_map *ev, unsigned int level)
{
	struct ng_deferred *q = &this_cpu_ptr(ng_deferred)->q[level];

	if (q->map_head - READ_ONCE(q->map_tail) >= NG_DEFER_MAPS) {
		pr_warn_ratelimited("a page of the mapping at 0x%llx is no longer traced\n",
				    ev->virt);
	} else {
		q->map[q->map_head % NG_DEFER_MAPS] = *ev;
		/* the event before the head that shows it (one CPU) */
		smp_store_release(&q->map_head, q->map_head + 1);
	}
	this_cpu_inc(ng_deferred_gen);
	irq_work_queue(this_cpu_ptr(&ng_deferred_iw));
}

/*
 * Records lost on this CPU (ng_deferred full) not yet said: the next record
 * that goes out from this CPU says them.  Level 0, interrupts off.
 */
static DEFINE_PER_CPU(unsigned int, ng_lost_unsaid);

/* Level 0, interrupts off (the fault path, the irq_work). */
static noinline void ng_trace_lost(const struct mmiotng_access *a, unsigned int lost)
{
	struct mmiotng_access r = *a;

	r.lost = min_t(unsigned int, lost, U16_MAX);
	this_cpu_sub(ng_lost_unsaid, r.lost);
	trace_mmiotng_access(&r);
}

/* Level 0, interrupts off (the fault path, the irq_work). */
static void ng_trace(const struct mmiotng_access *a)
{
	unsigned int lost = this_cpu_read(ng_lost_unsaid);

	lockdep_assert_irqs_disabled();
	if (unlikely(lost))
		ng_trace_lost(a, lost);	/* a copy, on its own stack */
	else
		trace_mmiotng_access(a);
}

/* A MAP (or NOT traced) event at level 0: interrupts off while it is traced. */
static void ng_trace_map(const struct mmiotng_map *ev)
{
	unsigned long flags;

	local_irq_save(flags);
	trace_mmiotng_map(ev);
	local_irq_restore(flags);
}

/* ng_report_deferred() when something was queued since the last look */
static noinline void ng_report_queued(unsigned int gen)
{
	struct ng_deferred *q = this_cpu_ptr(ng_deferred)->q;
	unsigned int i, lost;

	/* what is queued from here on counts again: emptied next time */
	this_cpu_write(ng_deferred_seen, gen);
	barrier();
	for (i = 1; i < NG_LEVELS; i++) {
		/* pairs with ng_defer*(): the slot is filled before the head moves */
		while (q[i].map_tail != smp_load_acquire(&q[i].map_head)) {
			struct mmiotng_map ev = q[i].map[q[i].map_tail % NG_DEFER_MAPS];

			/* copied before the slot is given back */
			smp_store_release(&q[i].map_tail, q[i].map_tail + 1);
			ng_trace_map(&ev);
		}
		lost = READ_ONCE(q[i].lost) - q[i].lost_said;
		if (lost) {
			q[i].lost_said += lost;
			this_cpu_add(ng_lost_unsaid, lost);
		}
		/* pairs with ng_defer*(): the slot is filled before the head moves */
		while (q[i].tail != smp_load_acquire(&q[i].head)) {
			/* declared here: zeroed (INIT_STACK_ALL_ZERO) only for a record */
			struct mmiotng_access a = q[i].rec[q[i].tail % NG_DEFER_RECS];

			/* copied before the slot is given back */
			smp_store_release(&q[i].tail, q[i].tail + 1);
			ng_trace(&a);
		}
	}
}

/*
 * Trace what NMI-like contexts queued on this CPU; level 0, interrupts off.
 * Inline: on every access, where the queues are almost always empty.
 */
static __always_inline void ng_report_deferred(void)
{
	unsigned int gen = this_cpu_read(ng_deferred_gen);

	if (gen != this_cpu_read(ng_deferred_seen))
		ng_report_queued(gen);
}

static void ng_deferred_irq_work(struct irq_work *w)
{
	ng_report_deferred();
}

int ng_report_init(void)
{
	int cpu;

	/* hard irq_works: in interrupt context on PREEMPT_RT too */
	for_each_possible_cpu(cpu) {
		struct irq_work *w = per_cpu_ptr(&ng_deferred_iw, cpu);

		*w = IRQ_WORK_INIT_HARD(ng_deferred_irq_work);
	}
	ng_deferred = alloc_percpu(struct ng_deferred_cpu);
	return ng_deferred ? 0 : -ENOMEM;
}

/*
 * After the fault hook and the single-step are gone (the last steps'
 * records were queued by their traps, each with the irq_work that traces
 * it): wait for those irq_works, then free the queues.
 */
void ng_report_exit(void)
{
	int cpu;

	for_each_possible_cpu(cpu)
		irq_work_sync(per_cpu_ptr(&ng_deferred_iw, cpu));
	free_percpu(ng_deferred);
	ng_deferred = NULL;
}

void ng_report(const struct mmiotng_access *a)
{
	unsigned int level = ng_level();

	ng_flight_access(a);
	if (level) {
		ng_defer(a, level);
		return;
	}
	ng_report_deferred();	/* they came first */
	ng_trace(a);
}

/*
 * An emulated access.  At level 0 the records queued before it go first,
 * then it is stamped for --sync (mmiotng_sync.c): no record of this CPU
 * that enters the ring before it is newer than its stamp.  With the
 * flight recorder on, one clock read serves its flight record and its
 * trace record (with hpet as the clock, a read is an emulated device
 * access).
 */
void ng_report_emulated(struct mmiotng_access *a)
{
	if (ng_level()) {
		if (!a->ts_ns && ng_flight_on())
			a->ts_ns = ktime_get_mono_fast_ns();
		ng_report(a);
		return;
	}
	ng_report_deferred();
	ng_sync_stamp(a);
	if (!a->ts_ns && ng_flight_on())
		a->ts_ns = ktime_get_mono_fast_ns();
	ng_flight_access(a);
	ng_trace(a);
}

/* A mapping of a traced range was armed (err 0) or left unarmed (why). */
void ng_report_map(unsigned long virt, phys_addr_t phys, unsigned long size, int err)
{
	struct mmiotng_map ev = {
		.virt = virt, .phys = phys, .size = size, .err = err,
	};

	if (!err && virt)
		ng_flight_map(virt, phys, size);
	ng_trace_map(&ev);
}

/* A page given up at this level (ng_untrap): deferred above level 0. */
void ng_report_unarmed(const struct mmiotng_map *ev, unsigned int level)
{
	if (level && level < NG_LEVELS)
		ng_defer_map(ev, level);
	else
		ng_trace_map(ev);
}

/* What the kernel's mmiotrace would print for this access. */
void ng_fill_compat(struct mmiotng_access *acc, const struct ng_compat_plan *plan,
		    const struct pt_regs *regs)
{
	acc->compat_op = plan->op;
	acc->compat_width = plan->width;
	acc->compat_value = ng_compat_value(plan, regs);
}
