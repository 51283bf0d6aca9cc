// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the page fault on an armed page.
 *
 * An access to an armed page faults; the kernel's fault path reaches
 * bad_area_nosemaphore(regs, error_code, address), the first function on
 * that path that can be hooked.  An ftrace ops with IPMODIFY (as livepatch
 * uses) sees every call: for a fault on an armed page it decodes the
 * instruction, performs the access through a window onto the device page
 * (mmiotng_window.c, never armed), updates the registers, reports the
 * access and sends the call to ng_fault_done(), which returns at once; for any other fault it
 * changes nothing and bad_area_nosemaphore() runs as it would without the
 * helper.  The original is never called through a pointer (no indirect
 * call into kernel text, which IBT forbids), and an ftrace ops, unlike a
 * kprobe, also runs while a kprobe handler is active on the CPU (a driver's
 * kprobe or a BPF program whose code touches the device).  The ops is
 * PERMANENT, as livepatch's: sysctl kernel.ftrace_enabled=0, which would
 * unpatch the hook under armed pages, is refused while it is registered,
 * and registering it fails while ftrace_enabled is 0 (the helper does not
 * load).
 *
 * Instructions the decoder does not know, and accesses the window cannot
 * reach (across the end of a mapping), are single-stepped (mmiotng_step.c).  The
 * benchmarks' MMIOTNG_MODE_TRAP_ONLY skips instructions instead
 * (ng_trap_only).
 *
 * Each access is reported through the tracepoint mmiotng_access
 * (mmiotng_report.c), where the BPF side attaches a raw tracepoint program.
 *
 * Locking in this file:
 *  - ng_fault_ftrace() runs in the page-fault exception with interrupts
 *    off, on every CPU at once, in any context the faulting code was in
 *    (process, softirq, hardirq, NMI).  The emulation path takes no lock:
 *    it finds the mapping under RCU and uses mapping and filter only
 *    inside that read-side section (both are freed after a grace period),
 *    and reaches the device through its CPU's window.
 *  - The mapping the fault is on is also the first one looked at for the
 *    instruction's operands (ng_device_at), inside the same RCU section.
 *  - ng_mode is read once per fault with READ_ONCE; the control path
 *    writes it.
 *  - The per-CPU ng_skip (MMIOTNG_MODE_TRAP_ONLY), ng_decoded and
 *    ng_user_page are only touched by their CPU with interrupts off.  A
 *    fault can nest in another's handling only from an NMI or from a probe
 *    handler inside it: ng_fault_depth counts them (a single this_cpu
 *    instruction each way), and a nested fault leaves the caches alone.
 *    The window it uses is that of its nesting level (NG_LEVELS), never
 *    the interrupted fault's; only level 0 single-steps.
 *  - ng_fault_user() and ng_fault_yield() run after ng_fault() has left
 *    its RCU section and per-CPU state (ng_fault_user() reads its CPU's
 *    ng_user_page first, and after a migration may mark a step on the new
 *    CPU: at worst a step is missed once and the instruction retried), in
 *    the faulting task, and may sleep with interrupts on (the task may
 *    resume on another CPU); each holds a reference to the module
 *    meanwhile, so a plain rmmod then fails.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/ftrace.h>
#include <linux/irq_work.h>
#include <linux/io.h>
#include <linux/kprobes.h>
#include <linux/kallsyms.h>
#include <linux/mm.h>
#include <linux/pagemap.h>
#include <linux/sched.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>
#include <asm/trap_pf.h>

#include "mmiotng.h"
#include "ng_decode.h"

/* ng_fill_access() reads a word of the bytes fetched */
static_assert(MMIOTNG_INSN_BYTES <= NG_COMPAT_MAX_BYTES);

DEFINE_PER_CPU(struct ng_stats, ng_stats);
unsigned int ng_mode = MMIOTNG_MODE_EMULATE;

/* ---- emulation ------------------------------------------------------ */

/* An instruction decoded, and what the kernel's tracer makes of it */
struct ng_decoding {
	struct ng_insn insn;
	struct ng_compat_plan plan;
	bool plain;		/* ng_plain_move(&insn) */
};

struct ng_emu_ctx {
	struct pt_regs *regs;
	const u8 *bytes;
	unsigned int nbytes;
	const struct ng_insn *insn;
	const struct ng_compat_plan *plan;
	bool plain;		/* ng_plain_move(insn) */
	/* the mapping the fault was on: the access is most likely in it */
	struct ng_mapping *m;
	/* a load waits for the registers it sets before it is reported */
	bool pending;
	/* a user page the instruction needs is not there (ng_fault_user) */
	unsigned long user_addr;
	unsigned int user_len;
	bool user_write;
	struct mmiotng_access acc;
};

static bool ng_is_string(const struct ng_insn *insn)
{
	return insn->kind == NG_KIND_MOVS || insn->kind == NG_KIND_STOS;
}

/* Whether an access through m at addr is inside the traced BAR. */
static bool ng_reported(const struct ng_mapping *m, unsigned long addr, unsigned int width)
{
	return ng_in_filter(m->filter, m->phys + (addr - m->virt), width);
}

/* The access itself, through the window; width is 1, 2, 4 or 8 (ng_emulate). */
static u64 ng_io_read(void __iomem *io, unsigned int width)
{
	switch (width) {
	case 1:
		return readb(io);
	case 2:
		return readw(io);
	case 4:
		return readl(io);
	default:
		return readq(io);
	}
}

static void ng_io_write(void __iomem *io, unsigned int width, u64 val)
{
	switch (width) {
	case 1:
		writeb(val, io);
		break;
	case 2:
		writew(val, io);
		break;
	case 4:
		writel(val, io);
		break;
	default:
		writeq(val, io);
		break;
	}
}

static void ng_emit(struct ng_emu_ctx *c)
{
	ng_report_emulated(&c->acc);
	c->pending = false;
}

/* Describe an access made through the window in c->acc. */
static void ng_describe(struct ng_emu_ctx *c, struct ng_mapping *m,
			unsigned long addr, u8 op, unsigned int width, u64 val)
{
	ng_fill_access(&c->acc, m, addr, c->regs->ip, c->bytes, c->nbytes);
	c->acc.op = op;
	c->acc.width = width;
	c->acc.value = val;
	if (ng_is_string(c->insn))
		c->acc.flags |= MMIOTNG_F_REP;
}

/* A user page that is not there: remember it for ng_fault_user(). */
static int ng_user_missing(struct ng_emu_ctx *c, unsigned long addr,
			   unsigned int width, bool write)
{
	c->user_addr = addr;
	c->user_len = width;
	c->user_write = write;
	return -EFAULT;
}

/*
 * The user side of a movs (copy_to_user from a BAR, rep movsb with ERMS):
 * whether its destination can be written without a fault, tested before
 * the element is read from the device, so that no element is read twice.
 * The bytes are written back as they were.
 */
static int ng_user_writable(struct ng_emu_ctx *c, unsigned long addr, unsigned int width)
{
	u64 old;

	if (copy_from_user_nofault(&old, (const void __user *)addr, width) ||
	    copy_to_user_nofault((void __user *)addr, &old, width))
		return ng_user_missing(c, addr, width, true);
	return 0;
}

/*
 * Where an operand of the instruction is: ng_device_at(), but for an
 * instruction from user mode (a process's mapping, mmiotng_user.c) only its
 * own page is a device's, anything else must be the process's memory, and
 * an operand in kernel memory (or across the page) is not emulated: the
 * instruction then runs untraced and the CPU refuses it as it would.
 */
static void __iomem *ng_operand_at(struct ng_emu_ctx *c, unsigned long addr,
				   unsigned int width, struct ng_mapping **mp)
{
	const struct ng_mapping *m = c->m;

	if (likely(!m->user))
		return ng_device_at(c->m, addr, width, mp);
	if (addr - m->base < m->len && width <= m->len - (addr - m->base))
		return ng_device_at(c->m, addr, width, mp);
	if (addr >= TASK_SIZE_MAX || width > TASK_SIZE_MAX - addr ||
	    (addr < m->base + m->len && m->base < addr + width))
		return NG_UNREACHABLE;
	return NULL;
}

static int ng_emu_read(void *ctx, unsigned long addr, unsigned int width, u64 *val)
{
	struct ng_emu_ctx *c = ctx;
	struct ng_mapping *m, *dst;
	struct ng_page *dst_pg2;
	void __iomem *io = ng_operand_at(c, addr, width, &m);
	int ret;

	if (c->pending)
		ng_emit(c);
	*val = 0;
	if (IS_ERR(io))
		return PTR_ERR(io);	/* single-stepped */
	if (!io) {
		/* the other operand of a movs: kernel or user memory */
		if (addr >= TASK_SIZE_MAX)
			return copy_from_kernel_nofault(val, (void *)addr, width);
		if (copy_from_user_nofault(val, (const void __user *)addr, width))
			return ng_user_missing(c, addr, width, false);
		return 0;
	}
	if (c->insn->kind == NG_KIND_MOVS && c->regs->di < TASK_SIZE_MAX) {
		ret = ng_user_writable(c, c->regs->di, width);
		if (ret)
			return ret;
	} else if (c->insn->kind == NG_KIND_MOVS && c->m->user) {
		return -EFAULT;		/* a process's copy into kernel memory: refused */
	} else if (c->insn->kind == NG_KIND_MOVS &&
		   IS_ERR(ng_page_at(c->m, c->regs->di, width, &dst, &dst_pg2))) {
		/* the write would be stepped: so is the read, only there */
		return -EFAULT;
	}
	*val = ng_io_read(io, width);
	if (!ng_reported(m, addr, width))
		return 0;	/* beside a small BAR, in its page: not traced */
	ng_describe(c, m, addr, MMIOTNG_OP_READ, width, *val);
	/*
	 * String reads are unknown to the kernel's decoder whatever the
	 * registers hold; a plain load is reported once its register is set.
	 */
	if (ng_is_string(c->insn)) {
		ng_fill_compat(&c->acc, c->plan, c->regs);
		ng_emit(c);
	} else {
		c->pending = true;
	}
	return 0;
}

static int ng_emu_write(void *ctx, unsigned long addr, unsigned int width, u64 val)
{
	struct ng_emu_ctx *c = ctx;
	struct ng_mapping *m;
	void __iomem *io = ng_operand_at(c, addr, width, &m);

	if (c->pending)
		ng_emit(c);
	if (IS_ERR(io))
		return PTR_ERR(io);	/* single-stepped */
	if (!io) {
		/* the other operand of a movs: kernel or user memory */
		if (addr < TASK_SIZE_MAX) {
			if (copy_to_user_nofault((void __user *)addr, &val, width))
				return ng_user_missing(c, addr, width, true);
			return 0;
		}
		switch (width) {
		case 1:
			WRITE_ONCE(*(u8 *)addr, val);
			break;
		case 2:
			WRITE_ONCE(*(u16 *)addr, val);
			break;
		case 4:
			WRITE_ONCE(*(u32 *)addr, val);
			break;
		case 8:
			WRITE_ONCE(*(u64 *)addr, val);
			break;
		default:
			return -EINVAL;
		}
		return 0;
	}
	if (unlikely(c->m->user && !c->m->user_write))
		return -EFAULT;		/* a read-only mapping: its window is read-only too */
	if (!ng_reported(m, addr, width)) {
		ng_io_write(io, width, val);	/* beside a small BAR: not traced */
		return 0;
	}
	ng_describe(c, m, addr, MMIOTNG_OP_WRITE, width, val);
	/* the kernel's tracer sees the registers as they are before the store */
	ng_fill_compat(&c->acc, c->plan, c->regs);
	/*
	 * Reported before the store: what the store makes the device do (an
	 * interrupt, on any CPU) is then recorded after it.
	 */
	ng_emit(c);
	ng_io_write(io, width, val);
	return 0;
}

/*
 * The common access, made without the general emulator's callbacks
 * (ng_emulate, ng_emu_ops: they cost as much again): a plain load or
 * store (ng_plain_move: c->plain) at the faulting address, all of it inside that
 * 4K page and inside the traced range.  In the same order as theirs: a
 * store is reported before it is made, a load once its register is set.
 * -EAGAIN, nothing done: not such an access (the general way does it).
 */
static int ng_emulate_plain(struct ng_emu_ctx *c, unsigned long addr)
{
	const struct ng_insn *insn = c->insn;
	struct pt_regs *regs = c->regs;
	unsigned int w = insn->mem_width;
	struct ng_page *pg;
	void __iomem *io;
	u64 val;

	if (!c->plain || ng_modrm_ea(insn, regs) != addr ||
	    (addr & ~PAGE_MASK) + w > PAGE_SIZE || !ng_reported(c->m, addr, w))
		return -EAGAIN;
	pg = ng_find_page(c->m, addr);
	io = pg ? ng_window_map(pg, addr, NULL, w) : NULL;
	if (!io)
		return -EAGAIN;
	if (insn->kind == NG_KIND_STORE || insn->kind == NG_KIND_STORE_IMM) {
		if (unlikely(c->m->user && !c->m->user_write))
			return -EAGAIN;		/* refused the general way */
		val = ng_store_value(insn, regs);
		ng_describe(c, c->m, addr, MMIOTNG_OP_WRITE, w, val);
		ng_fill_compat(&c->acc, c->plan, regs);
		ng_emit(c);
		ng_io_write(io, w, val);
	} else {
		val = ng_io_read(io, w);
		ng_load_result(insn, regs, val);
		ng_describe(c, c->m, addr, MMIOTNG_OP_READ, w, val);
		ng_fill_compat(&c->acc, c->plan, regs);
		ng_emit(c);
	}
	regs->ip += insn->len;
	return 0;
}

static const struct ng_mem_ops ng_emu_ops = {
	.read = ng_emu_read,
	.write = ng_emu_write,
};

/*
 * Elements of a rep string instruction emulated per fault: the fault runs
 * with interrupts off, so a blit of any length lets interrupts, the
 * tracer's reader and other tasks in between chunks (the instruction
 * faults again where it stopped).  Read once per fault; any value written
 * to the parameter is clamped to 1..NG_REP_CHUNK_MAX.
 */
#define NG_REP_CHUNK_MAX	4096
static unsigned int ng_rep_chunk = 64;
module_param_named(rep_chunk, ng_rep_chunk, uint, 0644);
MODULE_PARM_DESC(rep_chunk, "elements of a rep movs/stos emulated per fault, interrupts off (1-"
		 __stringify(NG_REP_CHUNK_MAX) ", default 64)");

/*
 * Whether the faulting kernel code may be scheduled out between two chunks
 * of a rep: as ng_may_fault_in(), in any task but the idle task, outside
 * RCU read-side sections and sections with bottom halves off (PREEMPT_RT
 * counts them apart), outside non_block_start() sections, and only where
 * preempt_count() tells atomic sections: a kernel without
 * CONFIG_PREEMPT_COUNT (no preemption, not even PREEMPT_DYNAMIC's) shows no
 * spinlock in it, and there the task never yields.  A kernel that preempts
 * kernel code needs no yield: the fault's return preempts the task.
 */
static bool ng_may_yield(const struct pt_regs *regs)
{
	if (!IS_ENABLED(CONFIG_PREEMPT_COUNT) || !(regs->flags & X86_EFLAGS_IF) ||
	    preempt_count() || softirq_count() || pagefault_disabled() ||
	    rcu_preempt_depth() || is_idle_task(current))
		return false;
#ifdef CONFIG_DEBUG_ATOMIC_SLEEP
	if (current->non_block_count)
		return false;
#endif
	return true;
}

/*
 * The part of ng_may_yield() that the ftrace callback can tell (it may run
 * with preemption off on ftrace's account, which hides the rest): no yield
 * is set up where it would come to nothing.  Level 0 only.
 */
static bool ng_may_yield_here(const struct pt_regs *regs)
{
	return IS_ENABLED(CONFIG_PREEMPT_COUNT) && !ng_level() &&
	       (regs->flags & X86_EFLAGS_IF) && !pagefault_disabled() &&
	       !(preempt_count() & (NMI_MASK | HARDIRQ_MASK | SOFTIRQ_MASK));
}

enum ng_emu_result { NG_EMULATED, NG_YIELD, NG_MUST_STEP, NG_NEEDS_USER_PAGE };

/*
 * A user page an instruction needs, to be faulted in by ng_fault_user()
 * (this CPU, interrupts off until it runs).
 */
struct ng_user_page {
	unsigned long addr;
	unsigned int len;
	bool write;
	/* the fault-in failed: step this task's instruction at ip next time */
	struct task_struct *step_task;
	unsigned long step_ip;
};

static DEFINE_PER_CPU(struct ng_user_page, ng_user_page);
/*
 * tasks in ng_fault_user()'s fault-in or in ng_fault_yield(): only a forced
 * rmmod finds one
 */
static atomic_t ng_user_inflight = ATOMIC_INIT(0);

/* Emulate the faulting instruction. */
static enum ng_emu_result ng_emulate_fault(struct pt_regs *regs, struct ng_mapping *m,
					   unsigned long addr, const u8 *bytes,
					   unsigned int nbytes, const struct ng_decoding *dec)
{
	const struct ng_insn *insn = &dec->insn;
	/* c.acc is written whole by ng_describe() before any use: not zeroed */
	struct ng_emu_ctx c __uninitialized;
	struct ng_user_page *u;
	int ret, cpu;

	c.regs = regs;
	c.bytes = bytes;
	c.nbytes = nbytes;
	c.insn = insn;
	c.plan = &dec->plan;
	c.plain = dec->plain;
	c.m = m;

	ret = ng_emulate_plain(&c, addr);
	if (ret == -EAGAIN) {
		/* the rest of c: the general way's (ng_emu_ops) */
		c.pending = false;
		c.user_addr = 0;
		c.user_len = 0;
		c.user_write = false;
		/* at least 1: ng_emulate() takes 0 for no limit */
		ret = ng_emulate(insn, regs, addr, &ng_emu_ops, &c,
				 clamp_val(READ_ONCE(ng_rep_chunk), 1, NG_REP_CHUNK_MAX));
		if (c.pending) {
			/* the load is done and its register set: report it now */
			ng_fill_compat(&c.acc, &dec->plan, regs);
			ng_emit(&c);
		}
	}
	/*
	 * A partial rep resumes when the instruction faults again; in between,
	 * a task that is due to give the CPU up does (ng_fault_yield).
	 */
	if (ret == 0 || ret == NG_EMU_PARTIAL) {
		/*
		 * --sync: a task waits there for its record to be written once
		 * the instruction is done (the last element's record is the
		 * newest of its CPU): level 0 only, whose stamp this is.
		 */
		bool wait = ret == 0 && !ng_level() && ng_sync_pending();

		if (ret == NG_EMU_PARTIAL && !ng_level())
			ng_sync_take(&cpu);	/* a later chunk's stamp will do */
		if ((wait || (ret == NG_EMU_PARTIAL && need_resched())) &&
		    ng_may_yield_here(regs))
			return NG_YIELD;
		if (wait)
			ng_sync_take(&cpu);	/* it cannot wait here */
		return NG_EMULATED;
	}
	if (!ng_level())
		ng_sync_take(&cpu);	/* stepped or faulted in: no wait for its records */
	if (!c.user_len)
		return NG_MUST_STEP;
	/* the elements done so far stay done: registers say where it stopped */
	if (ng_level())
		return NG_MUST_STEP;	/* no waiting for a page there: ng_untrap */
	u = this_cpu_ptr(&ng_user_page);
	u->addr = c.user_addr;
	u->len = c.user_len;
	u->write = c.user_write;
	return NG_NEEDS_USER_PAGE;
}

/*
 * Whether the faulting code may sleep, as the kernel's own user fault
 * handling would in its place: interrupts were on, nothing atomic, page
 * faults allowed, a user address space.  Only in ng_fault_user(): in the
 * ftrace callback, preempt_count() may be ftrace's own (another ftrace
 * user on the hooked function makes ftrace disable preemption around the
 * callbacks), which would make a sleepable context look atomic.
 */
static bool ng_may_fault_in(const struct pt_regs *regs)
{
	return (regs->flags & X86_EFLAGS_IF) && !preempt_count() &&
	       !pagefault_disabled() && current->mm;
}

/*
 * The user operand of a movs/stos (the side that is not the device), if
 * its first element is not there now: the page is to be faulted in by
 * ng_fault_user() before the instruction is single-stepped, which runs it
 * with page faults disabled (ng_step_start).  Fault path, interrupts off.
 */
static bool ng_user_operand_missing(const struct ng_insn *insn, const struct pt_regs *regs)
{
	struct ng_user_page *u = this_cpu_ptr(&ng_user_page);
	unsigned long addr;
	u64 val = 0;
	bool write;

	if (insn->kind == NG_KIND_STOS ||
	    (insn->kind == NG_KIND_MOVS && regs->di < TASK_SIZE_MAX)) {
		addr = regs->di;
		write = true;
	} else if (insn->kind == NG_KIND_MOVS && regs->si < TASK_SIZE_MAX) {
		addr = regs->si;
		write = false;
	} else {
		return false;
	}
	if (addr >= TASK_SIZE_MAX)
		return false;
	if (!copy_from_user_nofault(&val, (const void __user *)addr, insn->mem_width) &&
	    (!write || !copy_to_user_nofault((void __user *)addr, &val, insn->mem_width)))
		return false;
	u->addr = addr;
	u->len = insn->mem_width;
	u->write = write;
	return true;
}

/* No fault-in for this task's instruction: step it next time, at ip. */
static void ng_step_next(const struct pt_regs *regs)
{
	struct ng_user_page *u = this_cpu_ptr(&ng_user_page);

	u->step_task = current;
	u->step_ip = regs->ip;
}

/*
 * A movs between the device and user memory with SMAP on and EFLAGS.AC
 * clear (a driver's copy without stac): the CPU refuses the user side, and
 * the kernel oopses at the instruction.  Neither emulated (the helper's
 * user copies are allowed) nor stepped (the oops would end the task
 * inside the step): its page is given up, and the instruction runs as it
 * would without the helper.
 */
static bool ng_smap_refuses(const struct ng_insn *insn, const struct pt_regs *regs)
{
	return insn->kind == NG_KIND_MOVS &&
	       (regs->di < TASK_SIZE_MAX || regs->si < TASK_SIZE_MAX) &&
	       cpu_feature_enabled(X86_FEATURE_SMAP) && !(regs->flags & X86_EFLAGS_AC);
}

/* The fault-in for this task's instruction failed before: step it now. */
static bool ng_step_forced(const struct pt_regs *regs)
{
	struct ng_user_page *u = this_cpu_ptr(&ng_user_page);

	if (u->step_task != current || u->step_ip != regs->ip)
		return false;
	u->step_task = NULL;
	return true;
}

/* ---- the fault ------------------------------------------------------ */

static unsigned int ng_fetch_insn(unsigned long ip, u8 *buf)
{
	unsigned int n;

	/* the instruction may end just before an unmapped page */
	for (n = NG_COMPAT_MAX_BYTES; n > 0; n--)
		if (!copy_from_kernel_nofault(buf, (void *)ip, n))
			return n;
	return 0;
}

/*
 * A fault on an address no armed mapping covers.  If its page is present
 * again (disarmed on another CPU since the access), the access only needs
 * to be retried: not-present entries are never cached, so nothing else
 * makes such a fault.  Otherwise it is not ours.
 */
static bool ng_fault_raced(unsigned long address)
{
	unsigned int level;
	pte_t *ptep;

	ptep = lookup_address(address, &level);
	if (!ptep || !pte_present(*ptep))
		return false;
	this_cpu_inc(ng_stats.retried);
	return true;
}

/* A word of p at offset off */
static __always_inline u64 ng_word(const u8 *p, unsigned int off)
{
	u64 w;

	memcpy(&w, p + off, sizeof(w));
	return w;
}

/*
 * memcmp() == 0 for n <= 24 (NG_COMPAT_MAX_BYTES): three words, the last
 * overlapping the second (memcmp goes a byte at a time).
 */
static bool ng_same_bytes(const u8 *a, const u8 *b, unsigned int n)
{
	BUILD_BUG_ON(NG_COMPAT_MAX_BYTES > 3 * sizeof(u64));
	if (n < sizeof(u64)) {
		while (n--)
			if (*a++ != *b++)
				return false;
		return true;
	}
	return ng_word(a, 0) == ng_word(b, 0) && ng_word(a, n - 8) == ng_word(b, n - 8) &&
	       (n <= 16 || ng_word(a, 8) == ng_word(b, 8));
}

/*
 * MMIOTNG_MODE_TRAP_ONLY (benchmarks, test_modes=1): the fault on an armed
 * page is taken and its instruction skipped, not decoded: the instruction
 * at the address (its bytes, compared on each fault, and its length) is
 * kept per CPU from the first fault there, when it is decoded.  No access
 * is made: a load leaves its register as it was, a string instruction its
 * counts, so only a driver that does not depend on what it reads (the
 * exerciser's loops) can be run so.  Nothing is reported; an instruction
 * the decoder does not know is single-stepped as in the other modes.
 */
struct ng_skip {
	unsigned long ip;
	unsigned int len;
	u8 bytes[NG_COMPAT_MAX_BYTES];
};

static DEFINE_PER_CPU(struct ng_skip, ng_skip);

/* Whether the faulting instruction was skipped (false: not decoded). */
static bool ng_trap_only(struct pt_regs *regs, bool nested)
{
	struct ng_skip *k = this_cpu_ptr(&ng_skip);
	u8 bytes[NG_COMPAT_MAX_BYTES];
	struct ng_insn insn;
	unsigned int nbytes;

	if (!nested && k->ip == regs->ip && k->len &&
	    !copy_from_kernel_nofault(bytes, (void *)regs->ip, k->len) &&
	    ng_same_bytes(bytes, k->bytes, k->len)) {
		regs->ip += k->len;
		return true;
	}
	nbytes = ng_fetch_insn(regs->ip, bytes);
	if (!nbytes || ng_decode(bytes, nbytes, &insn))
		return false;
	if (!nested) {
		k->ip = regs->ip;
		k->len = insn.len;
		memcpy(k->bytes, bytes, insn.len);
	}
	regs->ip += insn.len;
	return true;
}

/*
 * The instructions last decoded on this CPU: a fault at the same address
 * with the same bytes (each fault of a driver's loop) reuses the decoding.
 * The bytes are compared, so code that changed (a module loaded where
 * another was) is decoded again: the instruction's own and the 4 after it
 * that the kernel's tracer may read (NG_COMPAT_MAX_BYTES), at least the
 * MMIOTNG_INSN_BYTES a record keeps.  A nested fault (in an NMI, or in a
 * probe handler that runs inside this fault's handling) does not use it:
 * it may have interrupted its update.
 */
#define NG_DECODED	4
static_assert((NG_DECODED & (NG_DECODED - 1)) == 0, "NG_DECODED: a power of two");

struct ng_decoded {
	unsigned long ip;
	unsigned int nbytes;	/* of bytes[]: those compared */
	u8 bytes[NG_COMPAT_MAX_BYTES];
	struct ng_decoding dec;
};

static DEFINE_PER_CPU(struct ng_decoded [NG_DECODED], ng_decoded);

/* The bytes decoded from scratch into dec (false: unknown) */
static bool ng_decode_into(const u8 *bytes, unsigned int nbytes, struct ng_decoding *dec,
			   bool alu)
{
	if (alu ? ng_decode_alu(bytes, nbytes, &dec->insn) : ng_decode(bytes, nbytes, &dec->insn))
		return false;
	/* its failure leaves a plan of an unknown access: as good as any */
	ng_compat_plan(bytes, nbytes, &dec->plan);
	dec->plain = ng_plain_move(&dec->insn);
	return true;
}

/*
 * The instruction at ip: its bytes fetched into bytes (*nbytes of them,
 * 0 if none could be read), ng_decode() of them and what the kernel's
 * tracer would make of them (ng_compat_plan), through the cache: a hit
 * fetches only the bytes it compares, and gives the entry itself (level 0,
 * which only this CPU's level 0 touches, interrupts off: no copy).  NULL
 * if unknown.  A nested fault decodes into buf.
 */
static const struct ng_decoding *ng_decode_cached(unsigned long ip, u8 *bytes,
						  unsigned int *nbytes,
						  struct ng_decoding *buf, bool nested)
{
	struct ng_decoded *d = &this_cpu_ptr(ng_decoded)[(ip ^ (ip >> 6)) & (NG_DECODED - 1)];
	unsigned int n;

	if (!nested && d->ip == ip && d->nbytes &&
	    !copy_from_kernel_nofault(bytes, (void *)ip, d->nbytes) &&
	    ng_same_bytes(d->bytes, bytes, d->nbytes)) {
		*nbytes = d->nbytes;
		return &d->dec;
	}
	*nbytes = n = ng_fetch_insn(ip, bytes);
	if (!n)
		return NULL;
	if (nested)
		return ng_decode_into(bytes, n, buf, false) ? buf : NULL;
	d->ip = 0;	/* no entry while it is rewritten */
	if (!ng_decode_into(bytes, n, &d->dec, false))
		return NULL;
	d->nbytes = max_t(unsigned int, d->dec.insn.len + 4, MMIOTNG_INSN_BYTES);
	/*
	 * Fewer could be read (an unmapped page after the code): used once,
	 * not kept, as a hit would not see more once they can be read.
	 */
	if (n < d->nbytes)
		return &d->dec;
	memcpy(d->bytes, bytes, d->nbytes);
	d->ip = ip;
	return &d->dec;
}

enum ng_fault_result { NG_NOT_OURS, NG_HANDLED, NG_FAULT_IN_USER, NG_YIELD_CPU };

/*
 * What an NMI-like context cannot emulate (an instruction the decoder does
 * not know, an access across a mapping's end) cannot be
 * single-stepped there either (mmiotng_step.c), nor can a context that
 * re-entered the fault path at its own level (a probe on the helper's own
 * code, with a window and a lock section of its own level in use), nor one
 * four NMI-like levels deep: the page is given back to the mapping for
 * good, without ng_lock (ng_page_give_back), and the instruction runs on it,
 * untraced from now on, which the trace says (the mapping NOT traced,
 * -EDEADLK, queued as the accesses are).  So is the page of an access the
 * hardware would refuse (ng_smap_refuses, -EPERM).  False: nothing to give
 * back.
 */
static bool ng_untrap(struct ng_mapping *m, unsigned long addr, unsigned int level, int err)
{
	struct ng_page *pg = ng_find_page(m, addr);
	struct mmiotng_map ev = {
		.virt = m->virt, .phys = m->phys, .size = m->size, .err = err,
	};

	if (!pg || !ng_page_give_back(pg))
		return false;
	this_cpu_inc(ng_stats.refused);
	ng_report_unarmed(&ev, level);
	return true;
}

/* Levels of this CPU that are in ng_fault() (a bit each): re-entry shows. */
static DEFINE_PER_CPU(unsigned long, ng_levels_busy);

/* Faults on armed pages being handled on this CPU (more than one: nested). */
static DEFINE_PER_CPU(unsigned int, ng_fault_depth);

/* Handle a fault on an armed page. */
static enum ng_fault_result ng_fault(struct pt_regs *regs, unsigned long error_code,
				     unsigned long address)
{
	enum ng_fault_result res = NG_HANDLED;
	unsigned int level = ng_level();
	/* no zeroing (INIT_STACK_ALL_ZERO): one element per pass under TCG */
	u8 bytes[NG_COMPAT_MAX_BYTES] __uninitialized;
	struct ng_decoding buf __uninitialized;
	const struct ng_decoding *dec;
	const struct ng_insn *insn;
	enum ng_emu_result emu;
	struct ng_mapping *m;
	unsigned int nbytes, mode;
	bool decoded, nested, forced;

	if (error_code & (X86_PF_PROT | X86_PF_USER | X86_PF_RSVD | X86_PF_INSTR |
			  X86_PF_PK))
		return NG_NOT_OURS;
	if (user_mode(regs) || !is_vmalloc_addr((void *)address))
		return NG_NOT_OURS;
	rcu_read_lock();
	m = ng_find_mapping(address);
	if (!m) {
		rcu_read_unlock();
		return ng_fault_raced(address) ? NG_HANDLED : NG_NOT_OURS;
	}
	/* too deep, re-entered at its level, or on top of its own lock section */
	if (level >= NG_LEVELS || (this_cpu_read(ng_levels_busy) & BIT(level)) ||
	    (!level && ng_lock_mine())) {
		res = ng_untrap(m, address, level, -EDEADLK) ? NG_HANDLED : NG_NOT_OURS;
		rcu_read_unlock();
		return res;
	}
	this_cpu_or(ng_levels_busy, BIT(level));
	this_cpu_inc(ng_stats.faults);
	nested = this_cpu_inc_return(ng_fault_depth) > 1;
	/* only a task or an interrupt single-steps: its own second fault */
	if (!level && ng_stepping(regs->ip)) {
		/* the stepped instruction touches another armed page */
		ng_step_more(m, address);
		goto out;
	}
	mode = READ_ONCE(ng_mode);
	if (mode == MMIOTNG_MODE_TRAP_ONLY && ng_trap_only(regs, nested))
		goto out;
	/* an NMI-like context never single-steps (mmiotng_step.c): it emulates */
	if (level && mode == MMIOTNG_MODE_SINGLESTEP)
		mode = MMIOTNG_MODE_EMULATE;
	dec = ng_decode_cached(regs->ip, bytes, &nbytes, &buf, nested);
	insn = dec ? &dec->insn : NULL;
	decoded = insn;
	if (decoded && ng_smap_refuses(insn, regs)) {
		res = ng_untrap(m, address, level, -EPERM) ? NG_HANDLED : NG_NOT_OURS;
		goto out;
	}
	forced = !level && ng_step_forced(regs);
	if (decoded && mode == MMIOTNG_MODE_EMULATE && !forced) {
		emu = ng_emulate_fault(regs, m, address, bytes, nbytes, dec);
		if (emu == NG_EMULATED || emu == NG_YIELD) {
			this_cpu_inc(ng_stats.emulated);
			/* as for a fault-in: a task that sleeps in the module holds it */
			if (emu == NG_YIELD && try_module_get(THIS_MODULE)) {
				atomic_inc(&ng_user_inflight);
				res = NG_YIELD_CPU;
			} else if (emu == NG_YIELD) {
				int cpu;

				/* no wait: the stamp is not left for a later one */
				ng_sync_take(&cpu);
			}
			goto out;
		}
		if (emu == NG_NEEDS_USER_PAGE && !level)
			goto fault_in;
	}
	if (level) {
		res = ng_untrap(m, address, level, -EDEADLK) ? NG_HANDLED : NG_NOT_OURS;
		goto out;
	}
	/*
	 * A step with user memory on the other side runs with page faults
	 * off (it must not sleep: its state is this CPU's), so the user page
	 * is faulted in first, unless that failed already (then the kernel's
	 * uaccess fixup ends the copy, as it would without the helper).
	 */
	if (decoded && !forced && ng_user_operand_missing(insn, regs))
		goto fault_in;
	/* the mapping stays valid: freeing waits for the debug trap */
	ng_step_start(regs, m, address, bytes, nbytes, insn, decoded);
	goto out;
fault_in:
	/*
	 * ng_fault_user() runs next, on this CPU, in the faulting context,
	 * and may wait there without bound (a page of a FUSE file, or one
	 * userfaultfd serves): it holds a reference to the module, which
	 * makes rmmod fail meanwhile rather than wait in ng_fault_exit().
	 * None while the module is going: step it, as if the fault-in failed.
	 */
	if (try_module_get(THIS_MODULE)) {
		atomic_inc(&ng_user_inflight);
		res = NG_FAULT_IN_USER;
	} else {
		ng_step_next(regs);
	}
out:
	this_cpu_dec(ng_fault_depth);
	this_cpu_and(ng_levels_busy, ~BIT(level));
	rcu_read_unlock();
	return res;
}

/*
 * An access from user mode to an armed page of a process's mapping
 * (mmiotng_user.c): m is made up for that page, under RCU.  Emulated as
 * ng_fault() would, never stepped, no cache of decodings (the bytes at a
 * user address are each process's own); true if done (the registers past
 * the instruction, or where a rep chunk stopped).  The faulting task,
 * interrupts off, level 0.
 */
bool ng_fault_user_map(struct pt_regs *regs, struct ng_mapping *m, unsigned long address)
{
	u8 bytes[NG_COMPAT_MAX_BYTES] __uninitialized;
	struct ng_decoding dec __uninitialized;
	unsigned long cx = regs->cx;
	enum ng_emu_result emu;
	unsigned int n;
	int cpu;

	lockdep_assert_irqs_disabled();
	if (ng_level() || (this_cpu_read(ng_levels_busy) & BIT(0)) || ng_lock_mine())
		return false;
	/* the instruction may end just before an unmapped page */
	for (n = NG_COMPAT_MAX_BYTES; n > 0; n--)
		if (!copy_from_user_nofault(bytes, (const void __user *)regs->ip, n))
			break;
	/* never stepped: the ALU ops on memory are emulated too */
	if (!n || !ng_decode_into(bytes, n, &dec, true))
		return false;
	/* a read-modify-write through a read-only mapping: not even its read */
	if (!m->user_write && ng_alu_writes(&dec.insn))
		return false;
	this_cpu_or(ng_levels_busy, BIT(0));
	this_cpu_inc(ng_fault_depth);
	this_cpu_inc(ng_stats.faults);
	emu = ng_emulate_fault(regs, m, address, bytes, n, &dec);
	this_cpu_dec(ng_fault_depth);
	this_cpu_and(ng_levels_busy, ~BIT(0));
	if (emu == NG_YIELD)
		ng_sync_take(&cpu);	/* no waiting here: a return to user mode */
	/*
	 * A rep string that stopped at an element it could not do (the next
	 * page, a user page not there) after doing some: the registers say
	 * where; it faults again from there, on that page.
	 */
	if (emu != NG_EMULATED && emu != NG_YIELD &&
	    !(ng_is_string(&dec.insn) && dec.insn.rep && regs->cx != cx))
		return false;
	this_cpu_inc(ng_stats.emulated);
	return true;
}

/* Runs in place of bad_area_nosemaphore() for a fault that was handled. */
static noinline void ng_fault_done(struct pt_regs *regs, unsigned long error_code,
				   unsigned long address)
{
	barrier();
}

/*
 * Runs in place of bad_area_nosemaphore() when a string instruction
 * between a traced BAR and user memory found the user page missing, in the
 * faulting context: if that context may sleep, fault the page in as the
 * kernel's own fault handler would (interrupts on), then let the
 * instruction run again, which faults on the BAR again and is emulated
 * (or stepped) from where it stopped.  If it may not sleep, or the
 * fault-in fails (a bad user address), the instruction is single-stepped
 * next time, with page faults off, so that the kernel's uaccess fixup ends
 * the copy as it would without the helper.
 */
static noinline void ng_fault_user(struct pt_regs *regs, unsigned long error_code,
				   unsigned long address)
{
	struct ng_user_page *u = this_cpu_ptr(&ng_user_page);
	void __user *uaddr = (void __user *)u->addr;
	unsigned int len = u->len;
	bool write = u->write;
	size_t left = len;

	if (ng_may_fault_in(regs)) {
		local_irq_enable();
		left = write ? fault_in_writeable(uaddr, len) : fault_in_readable(uaddr, len);
		local_irq_disable();
	}
	if (left)
		ng_step_next(regs);
	atomic_dec(&ng_user_inflight);
	/*
	 * ng_fault()'s reference.  Interrupts stay off from here to the
	 * return into the kernel's fault path: ng_fault_exit()'s grace period
	 * waits for this CPU to leave the module's code.
	 */
	module_put(THIS_MODULE);
}

/*
 * Runs in place of bad_area_nosemaphore() after an access that waits for
 * its record (--sync, mmiotng_sync.c), or between two chunks of a rep
 * movs/stos (rep_chunk elements each) when the task is due to give the
 * CPU up: on a kernel that does not preempt kernel code, a blit that takes
 * seconds under the trap would otherwise keep the reader, softirqs and
 * RCU's grace periods off this CPU until it is done.  The registers say
 * where the instruction stopped; it faults again when the task runs on.
 */
static noinline void ng_fault_yield(struct pt_regs *regs, unsigned long error_code,
				    unsigned long address)
{
	int cpu;
	u64 ts = ng_sync_take(&cpu);	/* this CPU's: interrupts are still off */

	if (ng_may_yield(regs)) {
		local_irq_enable();
		if (ts)
			ng_sync_wait(cpu, ts);
		else
			cond_resched();
		local_irq_disable();
	}
	atomic_dec(&ng_user_inflight);
	/* as in ng_fault_user(): interrupts off from here on */
	module_put(THIS_MODULE);
}

static void notrace ng_fault_ftrace(unsigned long ip, unsigned long parent_ip,
				    struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	struct pt_regs *kregs = ftrace_get_regs(fregs);
	struct pt_regs *regs;

	if (!kregs)
		return;
	regs = (struct pt_regs *)regs_get_kernel_argument(kregs, 0);
	switch (ng_fault(regs, regs_get_kernel_argument(kregs, 1),
			 regs_get_kernel_argument(kregs, 2))) {
	case NG_HANDLED:
		instruction_pointer_set(kregs, (unsigned long)ng_fault_done);
		break;
	case NG_FAULT_IN_USER:
		instruction_pointer_set(kregs, (unsigned long)ng_fault_user);
		break;
	case NG_YIELD_CPU:
		instruction_pointer_set(kregs, (unsigned long)ng_fault_yield);
		break;
	case NG_NOT_OURS:
		break;
	}
}

static struct ftrace_ops ng_fault_ops = {
	.func = ng_fault_ftrace,
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY | FTRACE_OPS_FL_PERMANENT,
};

#define NG_FAULT_FUNC	"bad_area_nosemaphore"

/* a disabled kprobe that only looks a name up (ng_fault_func_cloned) */
static struct kprobe ng_lookup_probe;

/*
 * Whether the compiler made a clone of the hooked function that callers
 * call instead of it (.constprop, .isra: other arguments; .part: the rest
 * of it after the inlined head), so the fault path would bypass the hook.
 * A kprobe registered disabled finds a symbol without patching anything;
 * any answer but "no such symbol" counts as a clone (a symbol that cannot
 * be probed is still one callers may call).  Load time, process context.
 */
static bool ng_fault_func_cloned(void)
{
	static const char * const kinds[] = { "constprop", "isra", "part" };
	char name[64];
	unsigned int k, n;
	int ret;

	for (k = 0; k < ARRAY_SIZE(kinds); k++) {
		for (n = 0; n < 4; n++) {
			snprintf(name, sizeof(name), "%s.%s.%u", NG_FAULT_FUNC, kinds[k], n);
			memset(&ng_lookup_probe, 0, sizeof(ng_lookup_probe));
			ng_lookup_probe.symbol_name = name;
			ng_lookup_probe.flags = KPROBE_FLAG_DISABLED;
			ret = register_kprobe(&ng_lookup_probe);
			if (ret == -ENOENT)
				continue;
			if (!ret)
				unregister_kprobe(&ng_lookup_probe);
			pr_err("this kernel cannot be served: %s has a clone %s that callers may call instead\n",
			       NG_FAULT_FUNC, name);
			return true;
		}
	}
	return false;
}

/*
 * Put ops on the entry of func (the fault hook, the iounmap hook), saying
 * why not in the kernel log.  Load time, process context.
 */
int ng_ftrace_hook(struct ftrace_ops *ops, const char *func)
{
	char name[KSYM_NAME_LEN];
	int ret;

	strscpy(name, func, sizeof(name));
	ret = ftrace_set_filter(ops, name, strlen(name), 0);
	if (!ret)
		ret = register_ftrace_function(ops);
	if (ret == -EBUSY)
		pr_err("cannot hook %s: ftrace is disabled (sysctl kernel.ftrace_enabled=0), or another module (a livepatch) changes that function\n",
		       func);
	else if (ret)
		pr_err("cannot hook %s (ftrace): %d\n", func, ret);
	if (ret)
		ftrace_free_filter(ops);
	return ret;
}

void ng_ftrace_unhook(struct ftrace_ops *ops)
{
	unregister_ftrace_function(ops);
	ftrace_free_filter(ops);
}

int ng_fault_init(void)
{
	if (ng_fault_func_cloned())
		return -EOPNOTSUPP;
	return ng_ftrace_hook(&ng_fault_ops, NG_FAULT_FUNC);
}

/* After everything was disarmed: no fault can be ours any more. */
void ng_fault_exit(void)
{
	ng_ftrace_unhook(&ng_fault_ops);
	/*
	 * No task is in ng_fault_user()'s fault-in or ng_fault_yield() (each
	 * holds a reference to the module), unless the unload was forced
	 * (rmmod -f): then wait for it, as long as its page takes.  A CPU may
	 * still be in ng_fault_done/_user/_yield() after it, interrupts off.
	 */
	while (atomic_read(&ng_user_inflight))
		msleep(20);
	synchronize_rcu();
}
