// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: --sync, an access that waits for its record to be written.
 *
 * The tracer acknowledges (SYNC) for each CPU the timestamp of the newest
 * record of that CPU it has written to its output and flushed to the disk.
 * A CPU's records enter the ring in the order they are stamped (stamp and
 * record are made with interrupts off, one after the other), so an
 * acknowledgment at or past a stamp means that record is written.
 *
 * While a session asks for it, an emulated access (level 0) is stamped here
 * (its record carries that time), after the records queued before it
 * (ng_report_emulated()); once its instruction is done, a task that may
 * sleep there (ng_may_yield(), running) waits in ng_fault_yield() until its
 * CPU's acknowledgment reaches the stamp, or NG_SYNC_WAIT passes.  Then the
 * file holds the access before the code after it runs.  Accesses from
 * atomic contexts, single-stepped ones, and the tracer's own never wait:
 * they are written with the next access that does.  After a wait in vain
 * (the tracer stopped, or its writes need the waiting task), none waits
 * until the tracer has caught up with the late stamp on its CPU: one stall
 * of NG_SYNC_WAIT, not one per access.
 *
 * The wait polls and never sleeps: the task stays runnable (preempted at
 * most, by cond_resched() or an interrupt), as in any fault.  A task that
 * goes to sleep by its own choice counts for RCU Tasks as out of all kernel
 * text that may be rewritten (kprobes' optimizer waits for that before it
 * writes a jump over several instructions, and before it frees the code
 * it copied), while this task's registers point into the middle of the
 * function that made the access, after the access.
 *
 * Contexts: ng_sync_stamp(), ng_sync_pending() and ng_sync_take() run in
 * the fault path (interrupts off, this CPU's ng_sync_stamp_ts);
 * ng_sync_wait() in the faulting task after the fault handler, interrupts
 * on, preemptible (on another CPU than the stamp's); ng_sync_ack() and
 * ng_sync_stop() in process context under ng_mutex.  The rest is read
 * locklessly: a waiter polls the acknowledgments.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/errno.h>
#include <linux/jiffies.h>
#include <linux/ktime.h>
#include <linux/percpu.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/timekeeping.h>

#include "mmiotng.h"

#define NG_SYNC_WAIT	HZ	/* the longest an access waits for the tracer */

static bool ng_sync_on;
static pid_t ng_sync_tracer;		/* its thread group never waits */
static atomic64_t ng_sync_late;		/* a stamp waited for in vain, 0: none */
static atomic_t ng_sync_late_cpu;	/* and its CPU */
static DEFINE_PER_CPU(atomic64_t, ng_sync_acked);	/* written up to, per CPU */
static DEFINE_PER_CPU(u64, ng_sync_stamp_ts);	/* this CPU's access to wait for */

/* Stamp an access record of this CPU (level 0, interrupts off). */
void ng_sync_stamp(struct mmiotng_access *acc)
{
	if (!READ_ONCE(ng_sync_on))
		return;
	acc->ts_ns = ktime_get_mono_fast_ns();
	this_cpu_write(ng_sync_stamp_ts, acc->ts_ns);
}

/* Whether this CPU's last access waits for its record.  Interrupts off. */
bool ng_sync_pending(void)
{
	return this_cpu_read(ng_sync_stamp_ts) != 0;
}

/* The stamp of this CPU's last access and its CPU, taken (0: none). */
u64 ng_sync_take(int *cpu)
{
	*cpu = smp_processor_id();
	return this_cpu_xchg(ng_sync_stamp_ts, 0);
}

static bool ng_sync_done(int cpu, u64 ts)
{
	return atomic64_read(per_cpu_ptr(&ng_sync_acked, cpu)) >= ts || !READ_ONCE(ng_sync_on);
}

/* In the faulting task, interrupts on: until CPU @cpu's record of @ts is written. */
void ng_sync_wait(int cpu, u64 ts)
{
	unsigned long deadline = jiffies + NG_SYNC_WAIT;
	u64 late = atomic64_read_acquire(&ng_sync_late);

	if (!task_is_running(current) || current->tgid == READ_ONCE(ng_sync_tracer))
		return;
	if (late) {
		if (!ng_sync_done(atomic_read(&ng_sync_late_cpu), late))
			return;		/* still behind: no second stall */
		atomic64_cmpxchg(&ng_sync_late, late, 0);
	}
	while (!ng_sync_done(cpu, ts)) {
		if (signal_pending(current))
			return;
		if (time_after(jiffies, deadline)) {
			atomic_set(&ng_sync_late_cpu, cpu);
			/* pairs with the acquire above: the CPU before the stamp */
			atomic64_set_release(&ng_sync_late, ts);
			this_cpu_inc(ng_stats.sync_late);
			return;
		}
		cond_resched();		/* a preemption, never a sleep: see above */
		cpu_relax();
	}
}

/*
 * The tracer wrote every record of @cpu stamped up to @ts; the first SYNC
 * turns the waiting on.  ng_mutex held, in the tracer's task.
 */
int ng_sync_ack(u32 cpu, u64 ts)
{
	atomic64_t *acked;

	lockdep_assert_held(&ng_mutex);
	if (!IS_ENABLED(CONFIG_PREEMPT_COUNT))
		return -EOPNOTSUPP;	/* no telling where a task may sleep */
	if (cpu >= nr_cpu_ids || !cpu_possible(cpu))
		return -EINVAL;
	acked = per_cpu_ptr(&ng_sync_acked, cpu);
	if (ts > atomic64_read(acked))
		atomic64_set(acked, ts);
	if (!READ_ONCE(ng_sync_on)) {
		WRITE_ONCE(ng_sync_tracer, current->tgid);
		WRITE_ONCE(ng_sync_on, true);
	}
	return 0;
}

/* The session ended: no access waits any more. */
void ng_sync_stop(void)
{
	int cpu;

	lockdep_assert_held(&ng_mutex);
	WRITE_ONCE(ng_sync_on, false);	/* waiters see it and go */
	for_each_possible_cpu(cpu)
		atomic64_set(per_cpu_ptr(&ng_sync_acked, cpu), 0);
	atomic64_set(&ng_sync_late, 0);
	WRITE_ONCE(ng_sync_tracer, 0);
}
