// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the flight recorder.  With a session's FLIGHT_START every access
 * record also goes into reserved memory that a warm reboot keeps (layout:
 * struct mmiotng_flight_hdr in mmiotng_abi.h): a ring of the last records
 * of each CPU, the mappings they refer to, and, when the machine dies while
 * recording, why and where.  A panic or an oops also prints the newest
 * records of each CPU on the console (bounded: flight_console per CPU,
 * NG_FLIGHT_CONSOLE_MAX lines in all), which a serial console, netconsole
 * or pstore's ramoops keeps.  `mmiotrace-ng recover` reads the region after
 * the reboot through FLIGHT_READ.
 *
 * The region must be "Reserved" in the resource tree (the kernel's
 * memmap=SIZE$ADDR), never RAM the kernel uses; it is claimed
 * (request_mem_region) while recording, so ramoops or a second session
 * cannot share it, and mapped write-combining, as ramoops maps its memory:
 * a reset does not write back the CPU's caches, a WC buffer is drained by
 * the next fence (the crash notifiers fence).
 *
 * Contexts and locking:
 *  - ng_flight_access() and ng_flight_map() run in any context, NMI and
 *    int3 included, on any CPU at once: a CPU's ring is written only by that
 *    CPU; a record's slot is taken with local_inc_return() (an interrupting
 *    context takes the next one) and its seq is cleared first and written
 *    last, so a record cut short by a reset is seen as none.  The map table
 *    takes its slots from one atomic counter.  They find the region with
 *    rcu_dereference_sched(): they run with preemption or interrupts off.
 *  - Start and stop run in process context under ng_mutex (netlink, socket
 *    release, module exit); stop unpublishes the region and waits for a
 *    grace period before it unmaps it.
 *  - The panic and die notifiers run on the dying CPU, the others stopped
 *    (panic) or running on (oops): they read the rings as they are, and
 *    the first of them to run sets reason and message (ng_flight_crashed).
 *  - FLIGHT_READ copies from the session's mapping under ng_mutex, or maps
 *    the region for the copy when no session records there.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/io.h>
#include <linux/ioport.h>
#include <linux/kdebug.h>
#include <linux/ktime.h>
#include <linux/minmax.h>
#include <linux/moduleparam.h>
#include <linux/notifier.h>
#include <linux/panic_notifier.h>
#include <linux/printk.h>
#include <linux/ptrace.h>
#include <linux/security.h>
#include <linux/string.h>
#include <linux/timekeeping.h>
#include <asm/local.h>

#include "mmiotng.h"

#define NG_FLIGHT_CONSOLE_MAX	64	/* console lines at a crash, in all */

static unsigned int ng_flight_console = 8;
module_param_named(flight_console, ng_flight_console, uint, 0644);
MODULE_PARM_DESC(flight_console,
		 "newest flight records of each CPU printed at a panic or oops (at most 64 lines in all; 0: none)");

struct ng_flight {
	struct mmiotng_flight_hdr *hdr;	/* the mapping of the region */
	struct mmiotng_flight_map *maps;
	struct mmiotng_flight_rec *recs;
	phys_addr_t phys;
	u64 size;
	u32 nrecs;
	struct resource *claim;
};

static struct ng_flight ng_flight_state;
static struct ng_flight __rcu *ng_flight;	/* &ng_flight_state while recording */
static DEFINE_PER_CPU(local_t, ng_flight_next);
static atomic64_t ng_flight_map_next;
static atomic_t ng_flight_crashed;	/* 1: the region holds why (no LOCK on WC memory) */

static struct mmiotng_flight_rec *ng_flight_slot(struct ng_flight *f, int cpu, u64 n)
{
	return &f->recs[(u64)cpu * f->nrecs + n % f->nrecs];
}

/* The record of an access, into this CPU's ring (any context). */
void ng_flight_access(const struct mmiotng_access *a)
{
	struct mmiotng_flight_rec *r;
	struct ng_flight *f;
	local_t *next;
	u64 n;

	/* off, the common case: no read-side section (it is looked at again) */
	if (!rcu_access_pointer(ng_flight))
		return;
	rcu_read_lock_sched_notrace();
	f = rcu_dereference_sched(ng_flight);
	if (!f)
		goto out;
	next = this_cpu_ptr(&ng_flight_next);
	n = local_inc_return(next);
	r = ng_flight_slot(f, smp_processor_id(), n - 1);
	WRITE_ONCE(r->seq, 0);
	wmb();		/* WC: stores reach memory in any order but across a fence */
	r->ts_ns = a->ts_ns ? a->ts_ns : ktime_get_mono_fast_ns();
	r->map_virt = a->map_virt;
	r->phys = a->phys;
	r->value = a->value;
	r->ip = a->ip;
	r->width = a->width;
	r->op = a->op;
	r->flags = a->flags;
	wmb();		/* the record whole before its seq says so */
	/*
	 * Contexts on top of this one went round the whole ring meanwhile:
	 * the slot holds parts of their record and of this one, neither kept.
	 */
	if (local_read(next) - n < f->nrecs)
		WRITE_ONCE(r->seq, n);
	else
		WRITE_ONCE(r->seq, 0);
out:
	rcu_read_unlock_sched_notrace();
}

/* A traced mapping, into the map table (any context). */
void ng_flight_map(unsigned long virt, phys_addr_t phys, unsigned long size)
{
	struct mmiotng_flight_map *m;
	struct ng_flight *f;
	u64 n;

	rcu_read_lock_sched();
	f = rcu_dereference_sched(ng_flight);
	if (f) {
		n = atomic64_inc_return(&ng_flight_map_next);
		m = &f->maps[(n - 1) % MMIOTNG_FLIGHT_MAPS];
		WRITE_ONCE(m->seq, 0);
		wmb();	/* WC memory: the entry invalid before it changes */
		m->virt = virt;
		m->phys = phys;
		m->size = size;
		wmb();	/* and whole before it is valid again */
		WRITE_ONCE(m->seq, n);
	}
	rcu_read_unlock_sched();
}

/*
 * The region is memory the kernel reserved, in one piece, and not RAM; and
 * the kernel is not locked down against access to physical memory (the
 * region could be firmware's reserved memory: /dev/mem's rule).
 */
static int ng_flight_check(phys_addr_t phys, u64 size)
{
	if (security_locked_down(LOCKDOWN_DEV_MEM))
		return -EPERM;
	if (!size || !PAGE_ALIGNED(phys) || !PAGE_ALIGNED(size) || phys + size < phys)
		return -EINVAL;
	if (region_intersects(phys, size, IORESOURCE_SYSTEM_RAM, IORES_DESC_NONE) !=
	    REGION_DISJOINT)
		return -EINVAL;
	if (region_intersects(phys, size, IORESOURCE_MEM, IORES_DESC_RESERVED) !=
	    REGION_INTERSECTS)
		return -EINVAL;
	return 0;
}

static u64 ng_flight_layout(struct mmiotng_flight_hdr *h, u64 size, u32 want)
{
	u64 maps_off = ALIGN(sizeof(*h), 64);
	u64 maps_end = maps_off + MMIOTNG_FLIGHT_MAPS * sizeof(struct mmiotng_flight_map);
	u64 recs_off = ALIGN(maps_end, 64);
	u64 fit;

	if (recs_off >= size)
		return 0;
	fit = div_u64(size - recs_off, nr_cpu_ids * sizeof(struct mmiotng_flight_rec));
	h->maps_off = maps_off;
	h->recs_off = recs_off;
	return min_t(u64, fit, want);
}

/*
 * Start recording into [phys, phys + size): the last @want records of each
 * CPU, or as many as fit.  ng_mutex held.
 */
int ng_flight_start(phys_addr_t phys, u64 size, u32 want, const char *text)
{
	struct ng_flight *f = &ng_flight_state;
	struct mmiotng_flight_hdr *h;
	int cpu, ret;
	u64 nrecs;

	lockdep_assert_held(&ng_mutex);
	if (rcu_access_pointer(ng_flight))
		return -EBUSY;
	if (want < MMIOTNG_FLIGHT_MIN_RECS)
		return -EINVAL;
	ret = ng_flight_check(phys, size);
	if (ret)
		return ret;
	f->claim = request_mem_region(phys, size, "mmiotng flight recorder");
	if (!f->claim)
		return -EBUSY;
	h = memremap(phys, size, MEMREMAP_WC);
	if (!h) {
		ret = -ENOMEM;
		goto err_release;
	}
	memset(h, 0, size);
	nrecs = ng_flight_layout(h, size, want);
	if (nrecs < MMIOTNG_FLIGHT_MIN_RECS) {
		ret = -ENOSPC;
		goto err_unmap;
	}
	memcpy(h->magic, MMIOTNG_FLIGHT_MAGIC, sizeof(h->magic));
	h->version = MMIOTNG_FLIGHT_VERSION;
	h->cpus = nr_cpu_ids;
	h->recs = nrecs;
	h->rec_bytes = sizeof(struct mmiotng_flight_rec);
	h->maps = MMIOTNG_FLIGHT_MAPS;
	h->start_ns = ktime_get_mono_fast_ns();
	h->start_real_ns = ktime_get_real_ns();
	h->crash_cpu = -1;
	strscpy(h->text, text, sizeof(h->text));
	h->state = MMIOTNG_FLIGHT_RECORDING;
	f->hdr = h;
	f->maps = (void *)h + h->maps_off;
	f->recs = (void *)h + h->recs_off;
	f->phys = phys;
	f->size = size;
	f->nrecs = nrecs;
	for_each_possible_cpu(cpu)
		local_set(per_cpu_ptr(&ng_flight_next, cpu), 0);
	atomic64_set(&ng_flight_map_next, 0);
	atomic_set(&ng_flight_crashed, 0);
	wmb();		/* the header in memory before the first record */
	rcu_assign_pointer(ng_flight, f);
	return 0;

err_unmap:
	memunmap(h);
err_release:
	release_mem_region(phys, size);
	f->claim = NULL;
	return ret;
}

/* The session ended: the records stay, the region is let go.  ng_mutex held. */
void ng_flight_stop(void)
{
	struct ng_flight *f = rcu_dereference_protected(ng_flight, lockdep_is_held(&ng_mutex));

	if (!f)
		return;
	RCU_INIT_POINTER(ng_flight, NULL);
	synchronize_rcu();	/* every writer ran with preemption off */
	if (!atomic_read(&ng_flight_crashed))
		f->hdr->state = MMIOTNG_FLIGHT_STOPPED;
	wmb();	/* out of the WC buffers before the mapping goes */
	memunmap(f->hdr);
	release_mem_region(f->phys, f->size);
	f->hdr = NULL;
	f->claim = NULL;
}

/* Whether a session records into a flight region (any context). */
bool ng_flight_on(void)
{
	return !!rcu_access_pointer(ng_flight);
}

u32 ng_flight_recs(void)
{
	struct ng_flight *f = rcu_dereference_protected(ng_flight, lockdep_is_held(&ng_mutex));

	return f ? f->nrecs : 0;
}

/*
 * Copy @len bytes at @off of the region [phys, phys + size) to @buf: from
 * the session's mapping if it records there, else from a mapping made for
 * the copy.  ng_mutex held.
 */
int ng_flight_read(phys_addr_t phys, u64 size, u64 off, void *buf, size_t len)
{
	struct ng_flight *f = rcu_dereference_protected(ng_flight, lockdep_is_held(&ng_mutex));
	void *va;
	int ret;

	if (off > size || len > size - off)
		return -EINVAL;
	if (f && f->phys == phys && f->size == size) {
		memcpy(buf, (void *)f->hdr + off, len);
		return 0;
	}
	ret = ng_flight_check(phys, size);
	if (ret)
		return ret;
	if (!request_mem_region(phys, size, "mmiotng flight recorder"))
		return -EBUSY;
	va = memremap(phys + off, len, MEMREMAP_WC);
	if (va) {
		memcpy(buf, va, len);
		memunmap(va);
	}
	release_mem_region(phys, size);
	return va ? 0 : -ENOMEM;
}

static const char *ng_flight_op(u8 op)
{
	return op == MMIOTNG_OP_READ ? "R" : op == MMIOTNG_OP_WRITE ? "W" : "UNKNOWN";
}

/* The newest records of @cpu on the console, @lines printed so far; their count. */
static unsigned int ng_flight_print_cpu(struct ng_flight *f, int cpu, unsigned int lines)
{
	u64 next = local_read(per_cpu_ptr(&ng_flight_next, cpu));
	u64 n = next - min_t(u64, next, min(ng_flight_console, f->nrecs));

	for (; n < next && lines < NG_FLIGHT_CONSOLE_MAX; n++, lines++) {
		struct mmiotng_flight_rec *r = ng_flight_slot(f, cpu, n);

		if (READ_ONCE(r->seq) != n + 1)
			continue;
		pr_emerg("flight %d %llu %s %u 0x%llx 0x%llx %pS\n", cpu, n + 1,
			 ng_flight_op(r->op), r->width, r->phys, r->value,
			 (void *)(unsigned long)r->ip);
	}
	return lines;
}

/*
 * The newest records of each CPU, on the console: bounded, at a crash;
 * the dying CPU's first, which the bound must not leave out.
 */
static void ng_flight_print(struct ng_flight *f, int dying)
{
	unsigned int lines;
	int cpu;

	if (!ng_flight_console)
		return;
	pr_emerg("flight recorder: newest accesses (cpu seq op width phys value ip):\n");
	lines = ng_flight_print_cpu(f, dying, 0);
	for_each_possible_cpu(cpu)
		if (cpu != dying)
			lines = ng_flight_print_cpu(f, cpu, lines);
}

/* The machine is dying: say why in the region (the first to come), print the tail. */
static __printf(2, 3) void ng_flight_crash(u32 reason, const char *fmt, ...)
{
	struct mmiotng_flight_hdr *h;
	struct ng_flight *f;
	va_list args;

	f = rcu_dereference_sched(ng_flight);
	if (!f)
		return;
	h = f->hdr;
	if (reason == MMIOTNG_FLIGHT_PANIC)
		WRITE_ONCE(h->panicked, 1);
	if (!atomic_xchg(&ng_flight_crashed, 1)) {
		h->state = MMIOTNG_FLIGHT_CRASHED;
		h->crash_ns = ktime_get_mono_fast_ns();
		h->crash_cpu = raw_smp_processor_id();
		h->reason = reason;
		va_start(args, fmt);
		vscnprintf(h->message, sizeof(h->message), fmt, args);
		va_end(args);
		wmb();	/* out of the WC buffers before a reset */
		ng_flight_print(f, h->crash_cpu);
	}
	wmb();	/* panicked, and the records of this CPU, out of the WC buffers */
}

static int ng_flight_panic(struct notifier_block *nb, unsigned long event, void *msg)
{
	preempt_disable_notrace();
	ng_flight_crash(MMIOTNG_FLIGHT_PANIC, "%s", msg ? (const char *)msg : "");
	preempt_enable_notrace();
	return NOTIFY_DONE;
}

static int ng_flight_die(struct notifier_block *nb, unsigned long event, void *data)
{
	struct die_args *args = data;

	if (event != DIE_OOPS)
		return NOTIFY_DONE;
	preempt_disable_notrace();
	ng_flight_crash(MMIOTNG_FLIGHT_OOPS, "%s at %pS", args->str,
			args->regs ? (void *)instruction_pointer(args->regs) : NULL);
	preempt_enable_notrace();
	return NOTIFY_DONE;
}

static struct notifier_block ng_flight_panic_nb = {
	.notifier_call = ng_flight_panic,
	.priority = INT_MAX,	/* before notifiers that may not return */
};

static struct notifier_block ng_flight_die_nb = {
	.notifier_call = ng_flight_die,
};

int ng_flight_init(void)
{
	int ret = register_die_notifier(&ng_flight_die_nb);

	if (ret)
		return ret;
	ret = atomic_notifier_chain_register(&panic_notifier_list, &ng_flight_panic_nb);
	if (ret)
		unregister_die_notifier(&ng_flight_die_nb);
	return ret;
}

void ng_flight_exit(void)
{
	mutex_lock(&ng_mutex);
	ng_flight_stop();
	mutex_unlock(&ng_mutex);
	atomic_notifier_chain_unregister(&panic_notifier_list, &ng_flight_panic_nb);
	unregister_die_notifier(&ng_flight_die_nb);
}
