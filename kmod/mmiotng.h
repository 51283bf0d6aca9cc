/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Internal declarations of the mmiotng module.
 *
 * The files and their jobs:
 *   mmiotng_pages.c   page-table entries and mappings: arm, disarm, find
 *   mmiotng_probes.c  the ioremap and iounmap probes
 *   mmiotng_fault.c   the page fault: taken over with an ftrace ops, decoded,
 *                     emulated through a window, reported (tracepoint)
 *   mmiotng_report.c  the records: tracepoints, deferred above level 0
 *   mmiotng_window.c  the per-CPU windows the device is reached through
 *   mmiotng_step.c    the single-step fallback and its debug trap
 *   mmiotng_ctl.c     the session: owner, kprobes check, disarm, mode, stats
 *   mmiotng_filters.c the filters and their mappings, ARM_EXISTING
 *   mmiotng_pci.c     --all: filters for the devices a driver binds to
 *   mmiotng_nl.c      the generic-netlink transport of the session commands
 *   mmiotng_hooks.c   trace_marker and the kernel's own mmiotrace
 *   mmiotng_flight.c  the flight recorder: the last accesses in reserved memory
 *   mmiotng_sync.c    --sync: an access waits for its record to be written
 *   mmiotng_main.c    module init and exit
 *
 * Locking, for the whole module (each file repeats what concerns it):
 *  - ng_mutex serializes every change of the filter and mapping lists from
 *    process context (netlink commands, socket release, module exit).
 *  - ng_lock (a spinning lock, interrupts off: see below) guards the filter list, the mapping
 *    list, every ng_page and the unmap marks.  It is the only lock of the
 *    module taken in atomic context (the ioremap/iounmap probes, the
 *    single-step path).  Writers of the lists hold both.  Nothing is
 *    allocated or freed under it and nothing under it sleeps.  (The ioremap
 *    probe may allocate, GFP_NOWAIT, outside it and never on PREEMPT_RT.)
 *  - The fault path finds mappings under RCU (it runs with interrupts off)
 *    and takes no lock to emulate; a mapping is freed only after a grace
 *    period, a filter only after its mappings are gone and
 *    a grace period has passed.
 */
#ifndef MMIOTNG_H
#define MMIOTNG_H

#include <linux/types.h>
#include <linux/bits.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/rcupdate.h>
#include <linux/percpu.h>
#include <linux/atomic.h>
#include <linux/irqflags.h>
#include <linux/lockdep.h>
#include <linux/smp.h>
#include <linux/preempt.h>
#include <linux/workqueue.h>
#include <asm/pgtable_types.h>

#include "mmiotng_abi.h"

#define NG_MAX_FILTERS		MMIOTNG_MAX_FILTERS
/* a BAR of any size: the widest physical address space x86-64 has */
#define NG_MAX_FILTER_SIZE	BIT_ULL(52)
/* an instruction touches at most two operands, each on at most two pages */
#define NG_STEP_PAGES		4
/*
 * Contexts that can nest on one CPU and each reach the fault path: a task
 * or interrupt (0), an NMI or a debug trap or a kprobe's int3 on top of it
 * (1), and so on: the kernel's NMI nesting count (nmi_count()), which each
 * of those raises.  Each level has a window of its own (mmiotng_window.c),
 * so an NMI never touches the window of the code it interrupted; only
 * level 0 single-steps (mmiotng_step.c).  A fault deeper than that (four
 * such contexts stacked) gives its page up (ng_untrap).
 */
#define NG_LEVELS		4
/*
 * Mappings made ready for the ioremap probe, per filter (see ng_spare_get):
 * as many as NG_SPARE_BYTES hold, at least NG_SPARES_MIN (a 1 MiB range's
 * mapping takes 8 KiB as allocated: 32 of them; a 64 MiB range's 512 KiB:
 * 4).  One has room for the whole range's pages, but never takes more than
 * NG_SPARE_MAX_BYTES (about 32760 entries: 128 MiB of 4K pages, 64 GiB of
 * 2M pages, any BAR of 1G pages): a filter holds at most 4 MiB of spares
 * whatever the BAR's size.  A new mapping that needs more entries than a
 * spare has is NOT traced (-EFBIG) unless a mapping of its own can be
 * allocated at once in the probe (ng_mapping_atomic).
 */
#define NG_SPARES_MIN		4
#define NG_SPARES_MAX		32
#define NG_SPARE_BYTES		(256 * 1024)
#define NG_SPARE_MAX_BYTES	(1024 * 1024)

struct ng_mapping;
struct ng_compat_plan;

/*
 * A physical range to trace (a BAR of any size and alignment).  An armed
 * page of a small BAR also holds bytes outside it (another device's BAR):
 * accesses to those are emulated too but not reported.
 */
struct ng_filter {
	struct list_head node;	/* ng_filters: ng_mutex and ng_lock */
	struct list_head dead;	/* teardown list */
	phys_addr_t start;
	u64 size;
	u64 page_len;		/* bytes of the whole pages it lies in */
	/*
	 * Mappings big enough for any mapping of the range, allocated in
	 * process context: the ioremap probe takes one (on PREEMPT_RT it must
	 * not allocate) and the refill work replaces it.  ng_lock.
	 */
	struct ng_mapping *spare[NG_SPARES_MAX];
	unsigned int nspare;
	unsigned int spares;	/* how many it keeps */
	unsigned int max_pages;
	struct work_struct refill;
	bool dying;		/* unlinked: unmapped mappings are not kept */
};

/*
 * One page-table entry of an armed mapping: a 4K, 2M or 1G page (a PTE, a
 * PMD or a PUD; pte_t stands for all three: the same 64 bits).  32 bytes:
 * a spare for a huge BAR holds tens of thousands.
 */
struct ng_page {
	pte_t *ptep;
	unsigned long addr;
	pteval_t saved;		/* the entry before arming */
	u32 steppers;		/* CPUs single-stepping on it (ng_lock) */
	u8 level;		/* PG_LEVEL_4K, PG_LEVEL_2M or PG_LEVEL_1G */
	bool armed;
	bool lost;		/* found changed at disarm: not ours any more */
};

/* An ioremap of a filtered range. */
struct ng_mapping {
	struct list_head node;	/* ng_mappings, RCU */
	struct list_head dead;	/* teardown list */
	struct rcu_head rcu;
	struct ng_filter *filter;
	unsigned long virt;	/* as ioremap returned it */
	phys_addr_t phys;	/* as passed to ioremap */
	unsigned long size;	/* as passed to ioremap */
	unsigned long base;	/* virt & PAGE_MASK */
	unsigned long len;	/* bytes from base, whole pages */
	bool live;		/* armed and listed (ng_lock) */
	bool user;		/* a process's (mmiotng_user.c), made up per access */
	bool user_write;	/* user: the process's entry allows writes */
	/* pages[] all of one size: log2 of it (page i at base + i << shift); else 0 */
	u8 page_shift;
	unsigned int npages;
	unsigned int capacity;	/* entries pages[] has room for */
	struct ng_page pages[];
};

struct ng_stats {
	u64 armed_pages;
	u64 faults;
	u64 emulated;
	u64 singlestepped;
	u64 unknown;
	u64 refused;
	u64 retried;
	u64 stale;	/* armed entries found changed at disarm, left alone */
	u64 sync_late;	/* --sync: accesses that waited NG_SYNC_WAIT in vain */
};

DECLARE_PER_CPU(struct ng_stats, ng_stats);

extern struct mutex ng_mutex;

/*
 * ng_lock: a spinning lock whose word is the CPU that holds it (-1: free),
 * as printk's CPU lock.  It is taken and released by one atomic operation
 * each, with interrupts off, so a fault that comes in on top of a holder
 * on the same CPU (a probe on the helper's own code) always knows that its
 * CPU holds it (ng_lock_mine) and must not wait: there is no moment at
 * which the lock is held and its holder not yet (or no longer) recorded.
 * A fault in an NMI-like context never takes it (ng_untrap); the debug
 * trap of a level-0 step does, and never comes in on top of a section.
 */
extern atomic_t ng_lock_owner;

static inline bool ng_lock_mine(void)
{
	return atomic_read(&ng_lock_owner) == (int)raw_smp_processor_id();
}

/* With interrupts off (fault path, debug trap, or after local_irq_save). */
static inline void ng_lock_irqs_off(void)
{
	int cpu = raw_smp_processor_id();

	for (;;) {
		if (atomic_read(&ng_lock_owner) == -1 &&
		    atomic_cmpxchg_acquire(&ng_lock_owner, -1, cpu) == -1)
			return;
		cpu_relax();
	}
}

static inline void ng_unlock_irqs_off(void)
{
	atomic_set_release(&ng_lock_owner, -1);
}

static inline void ng_lock_irqsave(unsigned long *flags)
{
	local_irq_save(*flags);
	ng_lock_irqs_off();
}

static inline void ng_unlock_irqrestore(unsigned long flags)
{
	ng_unlock_irqs_off();
	local_irq_restore(flags);
}

/* What lockdep_assert_held() says for a kernel lock (lockdep kernels only). */
#define ng_lock_assert_held()	lockdep_assert(ng_lock_mine())

extern struct list_head ng_filters;
extern struct list_head ng_mappings;
extern unsigned int ng_mode;

/* The nesting level of the current context (NG_LEVELS). */
static inline unsigned int ng_level(void)
{
	return nmi_count() >> NMI_SHIFT;
}

/* mmiotng_pages.c */
void ng_flush_all(void);
void ng_flush_soon(void);
void ng_flush_init(void);
void ng_flush_sync(void);
struct ng_mapping *ng_mapping_alloc(unsigned long virt, phys_addr_t phys,
				    unsigned long size, int *err);
int ng_mapping_prepare(struct ng_mapping *m, unsigned long virt, phys_addr_t phys,
		       unsigned long size);
void ng_mapping_free(struct ng_mapping *m);
unsigned long ng_level_size(unsigned int level);
u64 ng_spare_bytes(void);
int ng_spares_init(struct ng_filter *f);
void ng_spares_free(struct ng_filter *f);
struct ng_mapping *ng_spare_get(struct ng_filter *f);
void ng_spare_put(struct ng_filter *f, struct ng_mapping *m);
struct ng_mapping *ng_mapping_atomic(unsigned long virt, unsigned long size);
void ng_mapping_recycle(struct rcu_head *head);
int ng_mapping_arm(struct ng_mapping *m, struct ng_filter *f);
void ng_mapping_disarm(struct ng_mapping *m);
struct ng_mapping *ng_find_mapping(unsigned long addr);
bool ng_overlaps_mapping(unsigned long base, unsigned long len);
bool ng_whole_area(unsigned long base, unsigned long len);
struct ng_page *ng_find_page(struct ng_mapping *m, unsigned long addr);
void ng_page_arm(struct ng_page *pg);
bool ng_page_disarm(struct ng_page *pg);
bool ng_page_give_back(struct ng_page *pg);
struct ng_filter *ng_find_filter(phys_addr_t phys, unsigned long size);
bool ng_overlaps_filter(phys_addr_t phys, unsigned long size);

/* mmiotng_window.c */
void __iomem *ng_window_map(const struct ng_page *pg, unsigned long addr,
			    const struct ng_page *pg2, unsigned int width);
void ng_windows_reset(void);
bool ng_overlaps_windows(unsigned long start, unsigned long len);
int ng_windows_init(void);
void ng_windows_exit(void);
/* where an access is made: a window onto its page (under RCU) */
#define NG_UNREACHABLE		IOMEM_ERR_PTR(-EFAULT)
#define NG_UNREACHABLE_PAGE	((struct ng_page *)ERR_PTR(-EFAULT))
bool ng_in_filter(const struct ng_filter *f, phys_addr_t phys, unsigned int width);
struct ng_page *ng_page_at(struct ng_mapping *hint, unsigned long addr,
			   unsigned int width, struct ng_mapping **mp,
			   struct ng_page **pg2);
void __iomem *ng_device_at(struct ng_mapping *hint, unsigned long addr,
			   unsigned int width, struct ng_mapping **mp);
void __iomem *ng_device_addr(unsigned long addr, unsigned int width);

/* mmiotng_probes.c */
bool ng_unmap_in_flight(unsigned long base, unsigned long len);
bool ng_probes_alive(void);
unsigned long ng_probes_missed(void);
int ng_probes_init(void);
void ng_probes_exit(void);

/* mmiotng_report.c: the records (tracepoints) */
void ng_report(const struct mmiotng_access *a);
void ng_report_emulated(struct mmiotng_access *a);
int ng_report_init(void);
void ng_report_exit(void);
void ng_report_map(unsigned long virt, phys_addr_t phys, unsigned long size, int err);
void ng_report_unarmed(const struct mmiotng_map *ev, unsigned int level);
void ng_fill_compat(struct mmiotng_access *acc, const struct ng_compat_plan *plan,
		    const struct pt_regs *regs);

/*
 * Every field of acc written once (it may be on a stack that was not
 * zeroed): no memset, and the instruction's bytes as one word, its bytes
 * past nbytes cleared.  bytes holds NG_COMPAT_MAX_BYTES (>= 8), of which
 * nbytes were fetched.
 */
static inline void ng_fill_access(struct mmiotng_access *acc, const struct ng_mapping *m,
				  unsigned long addr, unsigned long ip,
				  const u8 *bytes, unsigned int nbytes)
{
	unsigned int len = min_t(unsigned int, nbytes, MMIOTNG_INSN_BYTES);
	u64 word;

	BUILD_BUG_ON(sizeof(acc->insn) != sizeof(word));
	memcpy(&word, bytes, sizeof(word));
	if (len < MMIOTNG_INSN_BYTES)
		word &= (1ULL << (8 * len)) - 1;	/* little-endian: the first len */
	acc->map_virt = m->virt;
	acc->phys = m->phys + (addr - m->virt);
	acc->value = 0;
	acc->compat_value = 0;
	acc->ip = ip;
	acc->width = 0;
	acc->op = 0;
	acc->compat_width = 0;
	acc->compat_op = 0;
	acc->insn_len = len;
	acc->flags = m->user ? MMIOTNG_F_USER : 0;
	acc->lost = 0;
	memcpy(acc->insn, &word, sizeof(word));
	acc->ts_ns = 0;
	acc->map_phys = m->phys;
	acc->map_len = m->size;
}

/* mmiotng_user.c: processes' mappings */
void ng_user_init(void);
void ng_user_exit(void);
int ng_user_start(const u32 *pids, unsigned int npids, const char *comms, unsigned int ncomms);
int ng_user_arm(pid_t pid, unsigned long virt, unsigned long size);
void ng_user_stop(void);

/* mmiotng_fault.c */
bool ng_fault_user_map(struct pt_regs *regs, struct ng_mapping *m, unsigned long address);
struct ftrace_ops;
int ng_ftrace_hook(struct ftrace_ops *ops, const char *func);
void ng_ftrace_unhook(struct ftrace_ops *ops);
int ng_fault_init(void);
void ng_fault_exit(void);

/* mmiotng_step.c */
struct ng_insn;
bool ng_stepping(unsigned long ip);
void ng_step_start(struct pt_regs *regs, struct ng_mapping *m,
		   unsigned long addr, const u8 *bytes, unsigned int nbytes,
		   const struct ng_insn *insn, bool decoded);
void ng_step_more(struct ng_mapping *m, unsigned long addr);
void ng_wait_steps(void);
int ng_step_init(void);
void ng_step_exit(void);

/* mmiotng_ctl.c: the session (above mmiotng_pci.c and mmiotng_filters.c) */
enum ng_owner_kind { NG_IDLE, NG_TRACER, NG_KERNEL_TRACER };

struct net;
int ng_session_claim(u32 portid, const struct net *net);
bool ng_session_release(u32 portid, const struct net *net);
bool ng_check_probes(void);
bool ng_probes_were_off(void);
u32 ng_session_owner(void);
bool ng_kernel_tracer_start(void);
void ng_kernel_tracer_stop(void);
void ng_disarm_all(void);
int ng_set_mode(u32 mode);
void ng_get_stats(struct ng_stats *sum);

/* mmiotng_filters.c: the filters and the mappings armed in them */
int ng_filter_add(phys_addr_t start, u64 size);
int ng_filter_del(phys_addr_t start, u64 size);
void ng_filters_drop(phys_addr_t start, u64 size);
int ng_filter_insert(phys_addr_t start, u64 size);
void ng_filter_remove(phys_addr_t start, u64 size);
void ng_filters_clear(void);
int ng_arm_existing(unsigned long virt, u64 size, phys_addr_t phys);
unsigned int ng_nr_filters(void);
unsigned int ng_nr_mappings(void);

/* mmiotng_hooks.c */
int ng_hooks_init(void);
void ng_hooks_exit(void);

/* mmiotng_nl.c */
int ng_flight_init(void);
void ng_flight_exit(void);
int ng_flight_start(phys_addr_t phys, u64 size, u32 want, const char *text);
void ng_flight_stop(void);
u32 ng_flight_recs(void);
bool ng_flight_on(void);
int ng_flight_read(phys_addr_t phys, u64 size, u64 off, void *buf, size_t len);
void ng_flight_access(const struct mmiotng_access *a);
void ng_flight_map(unsigned long virt, phys_addr_t phys, unsigned long size);

void ng_sync_stamp(struct mmiotng_access *acc);
bool ng_sync_pending(void);
u64 ng_sync_take(int *cpu);
void ng_sync_wait(int cpu, u64 ts);
int ng_sync_ack(u32 cpu, u64 ts);
void ng_sync_stop(void);

int ng_nl_init(void);
void ng_nl_exit(void);

/* mmiotng_pci.c: devices bound during an --all session */
void ng_trace_new_devices(bool on);
struct pci_dev;
void ng_moving_clear(const struct pci_dev *dev);
int ng_pci_init(void);
void ng_pci_exit(void);

#endif /* MMIOTNG_H */
