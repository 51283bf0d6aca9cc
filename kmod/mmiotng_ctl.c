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
 *  - The filters and mappings are mmiotng_filters.c's; ending the tracing
 *    (ng_disarm_all) calls it and mmiotng_pci.c, neither of which calls
 *    back into this file.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/moduleparam.h>
#include <linux/string.h>
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
	ng_sync_stop();		/* first: no task waits for a tracer that is gone */
	ng_disarm_all();
	ng_flight_stop();
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

/*
 * End the tracing: no device bound from now on gets a filter, no BAR move
 * is followed, every filter and mapping goes.  ng_mutex held.
 */
void ng_disarm_all(void)
{
	lockdep_assert_held(&ng_mutex);
	ng_user_stop();		/* first: it needs the filters to arm nothing more */
	ng_trace_new_devices(false);
	ng_moving_clear(NULL);
	ng_filters_clear();
	WRITE_ONCE(ng_mode, MMIOTNG_MODE_EMULATE);
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
		sum->sync_late += s->sync_late;
	}
}
