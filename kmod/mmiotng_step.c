// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the single-step fallback.
 *
 * An instruction that is not emulated is executed for real, with the trap
 * flag set and interrupts off, and the debug trap after it reports the
 * access.  Two ways:
 *  - A decoded instruction (every access in MMIOTNG_MODE_SINGLESTEP) runs
 *    against this CPU's window onto the page (mmiotng_window.c): the
 *    register its address comes from is moved by the distance to the
 *    window for the one instruction and moved back in the trap.  No page
 *    changes: other CPUs keep faulting, nothing is missed, no lock is
 *    taken.
 *  - Any other instruction (the decoder does not know it) runs against the
 *    armed page, made present for the step and re-armed in the trap, as the
 *    kernel's kmmio does; other CPUs that use the page meanwhile are not
 *    traced until the flush that follows the trap reaches them
 *    (ng_flush_soon: microseconds).
 *
 * Only tasks and interrupts single-step (ng_level() 0), never an NMI-like
 * context (an NMI, a kprobe's int3 handler): the debug trap has one stack
 * per CPU, and an NMI can come in on top of a debug trap (a step's, or a
 * hardware breakpoint's) before that trap is done with its stack; a step
 * in the NMI would raise a second trap on the same stack and overwrite
 * the first one's saved registers.  ng_fault() emulates what such a
 * context does, or gives the page up (ng_untrap).
 *
 * Locking in this file:
 *  - The per-CPU ng_step is only touched by its CPU, in the fault path and
 *    in the debug trap, interrupts off in both.  An NMI on top of either
 *    never touches it.
 *  - ng_page.steppers and the entries are changed under ng_lock.
 *  - A stepped mapping stays valid until the trap: ng_wait_steps(), called
 *    by every path that frees mappings, waits for all steps to end.
 *  - A step never sleeps, so it ends on the CPU and in the task it began
 *    in: the stepped instruction runs with interrupts off, and with page
 *    faults off when it may touch user memory (a movs/stos with a user
 *    operand, or an instruction the decoder does not know), so that a user
 *    page fault inside it goes to the uaccess fixup instead of sleeping
 *    (ng_fault() faults the user page in first where the context allows).
 *    The debug trap takes a step only in its task, in kernel mode.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kdebug.h>
#include <linux/timekeeping.h>
#include <linux/delay.h>
#include <linux/notifier.h>
#include <linux/sched.h>
#include <linux/uaccess.h>
#include <asm/debugreg.h>

#include "mmiotng.h"
#include "mmiotng_compat.h"
#include "ng_decode.h"

/* A register pointed at the window for the step. */
struct ng_redirect {
	unsigned int no;	/* NG_REG_*: in the trap's registers, not the fault's */
	unsigned long delta;
	bool restore;	/* false: the instruction loads a new value into it */
};

/* Per-CPU state of a single-step in progress. */
struct ng_step {
	struct ng_redirect redir[2];
	unsigned int nredir;
	struct ng_mapping *map[NG_STEP_PAGES];
	struct ng_page *page[NG_STEP_PAGES];
	unsigned int npages;
	unsigned long ip;	/* the stepped instruction */
	struct task_struct *task;	/* the task it runs in */
	bool nofault;		/* page faults disabled for it */
	bool quiet;		/* beside a small BAR, in its page: not reported */
	unsigned long saved_flags;
	struct ng_insn insn;
	bool decoded;
	bool active;
	struct ng_compat_plan plan;
	struct mmiotng_access acc;
};

static DEFINE_PER_CPU(struct ng_step, ng_step);

/* Whether this CPU is stepping (at ip, unless ip is 0). */
bool ng_stepping(unsigned long ip)
{
	struct ng_step *s = this_cpu_ptr(&ng_step);

	return s->active && (!ip || s->ip == ip);
}

static bool ng_insn_is_load(const struct ng_insn *insn)
{
	return insn->kind == NG_KIND_LOAD || insn->kind == NG_KIND_MOVZX ||
	       insn->kind == NG_KIND_MOVSX;
}

/* Make the page of addr present for the step.  Interrupts off. */
static void ng_step_add_page(struct ng_step *s, struct ng_mapping *m,
			     unsigned long addr)
{
	struct ng_page *pg = ng_find_page(m, addr);
	unsigned int i;

	if (!pg)
		return;
	for (i = 0; i < s->npages; i++)
		if (s->page[i] == pg)
			return;
	if (s->npages == NG_STEP_PAGES)
		return;		/* cannot happen: see NG_STEP_PAGES */
	ng_lock_irqs_off();
	pg->steppers++;
	ng_page_disarm(pg);
	ng_unlock_irqs_off();
	s->map[s->npages] = m;
	s->page[s->npages] = pg;
	s->npages++;
}

/*
 * The pages of one operand of a movs (addr, width: at most two pages) that
 * are armed, made present for the step: a movs stepped against armed pages
 * would otherwise read its element from the device, fault on the write's
 * page and run again, reading it twice.  Fault path, interrupts off,
 * inside the fault's RCU read-side section.
 */
static void ng_step_add_operand(struct ng_step *s, unsigned long addr, unsigned int width)
{
	unsigned long last = addr + width - 1;
	struct ng_mapping *m;

	if (addr < TASK_SIZE_MAX)
		return;
	m = ng_find_mapping(addr);
	if (m)
		ng_step_add_page(s, m, addr);
	if ((addr ^ last) & PAGE_MASK) {
		m = ng_find_mapping(last);
		if (m)
			ng_step_add_page(s, m, last);
	}
}

static bool ng_redirect_reg(struct ng_step *s, struct pt_regs *regs,
			    unsigned int no, unsigned long delta, bool restore)
{
	unsigned long *reg = ng_gpr(regs, no);

	/* never the stack pointer: an exception would push onto the device */
	if (!reg || no == NG_REG_SP || s->nredir == ARRAY_SIZE(s->redir))
		return false;
	*reg += delta;
	s->redir[s->nredir].no = no;
	s->redir[s->nredir].delta = delta;
	s->redir[s->nredir].restore = restore;
	s->nredir++;
	return true;
}

/* rsi or rdi of a movs/stos, if it points into an armed mapping. */
static void ng_redirect_string(struct ng_step *s, struct pt_regs *regs,
			       unsigned int no, unsigned int width)
{
	unsigned long addr = *ng_gpr(regs, no);
	void __iomem *io = ng_device_addr(addr, width);

	if (io)
		ng_redirect_reg(s, regs, no, (unsigned long)io - addr, true);
}

/*
 * Whether the instruction may touch user memory besides the device: the
 * other operand of a movs or stos, or anything the decoder does not know.
 */
static bool ng_step_may_touch_user(const struct pt_regs *regs, const struct ng_insn *insn,
				   bool decoded)
{
	if (!decoded)
		return true;
	if (insn->kind == NG_KIND_STOS)
		return regs->di < TASK_SIZE_MAX;
	if (insn->kind == NG_KIND_MOVS)
		return regs->di < TASK_SIZE_MAX || regs->si < TASK_SIZE_MAX;
	return false;
}

/* Whether the register operand of the instruction is register no. */
static bool ng_uses_reg(const struct ng_insn *insn, unsigned int no)
{
	if (insn->reg == NG_REG_NONE)
		return false;
	return insn->high8 ? insn->reg - 4 == no : insn->reg == no;
}

/*
 * Point a decoded instruction's memory operand at the window: its base
 * register (or its index, without a base) moves by the distance.  A load
 * into that register must overwrite it whole (4 or 8 bytes); it is then not
 * moved back.  A store of that register is not redirected (it would store
 * the moved value).  False: the step must use the armed page instead.
 */
static bool ng_step_redirect(struct ng_step *s, struct pt_regs *regs,
			     const struct ng_insn *insn)
{
	unsigned long ea, delta;
	void __iomem *io;
	unsigned int no;
	bool into;

	s->nredir = 0;
	if (insn->kind == NG_KIND_MOVS || insn->kind == NG_KIND_STOS) {
		/*
		 * With user memory on the other side the step runs with page
		 * faults off (ng_step_start): the user side is stepped against
		 * the device page made present.
		 */
		if (regs->di < TASK_SIZE_MAX ||
		    (insn->kind == NG_KIND_MOVS && regs->si < TASK_SIZE_MAX))
			return false;
		/* two traced operands would need two windows */
		if (insn->kind == NG_KIND_MOVS && ng_device_addr(regs->si, insn->mem_width) &&
		    ng_device_addr(regs->di, insn->mem_width))
			return false;
		if (insn->kind == NG_KIND_MOVS)
			ng_redirect_string(s, regs, NG_REG_SI, insn->mem_width);
		ng_redirect_string(s, regs, NG_REG_DI, insn->mem_width);
		return s->nredir > 0;
	}
	if (insn->base == NG_REG_RIP || insn->base == insn->index)
		return false;
	ea = (unsigned long)(long)insn->disp;
	if (insn->base != NG_REG_NONE)
		ea += *ng_gpr(regs, insn->base);
	if (insn->index != NG_REG_NONE)
		ea += *ng_gpr(regs, insn->index) * insn->scale;
	io = ng_device_addr(ea, insn->mem_width);
	if (!io)
		return false;
	delta = (unsigned long)io - ea;
	no = insn->base;
	if (no == NG_REG_NONE) {
		no = insn->index;
		if (no == NG_REG_NONE || delta % insn->scale)
			return false;
		delta /= insn->scale;
	}
	into = ng_uses_reg(insn, no);
	if (into && (!ng_insn_is_load(insn) || insn->reg_width < 4))
		return false;
	return ng_redirect_reg(s, regs, no, delta, !into);
}

/*
 * Single-step the faulting instruction: against the window if it is
 * decoded, else with its page present.  Fault path, interrupts off; the
 * mapping is valid until the trap.
 */
void ng_step_start(struct pt_regs *regs, struct ng_mapping *m,
		   unsigned long addr, const u8 *bytes, unsigned int nbytes,
		   const struct ng_insn *insn, bool decoded)
{
	struct ng_step *s = this_cpu_ptr(&ng_step);

	s->npages = 0;
	s->nredir = 0;
	/* the record describes the registers as they are before the step */
	ng_fill_access(&s->acc, m, addr, regs->ip, bytes, nbytes);
	ng_compat_plan(bytes, nbytes, &s->plan);
	ng_fill_compat(&s->acc, &s->plan, regs);
	s->ip = regs->ip;
	s->task = current;
	s->nofault = ng_step_may_touch_user(regs, insn, decoded);
	if (s->nofault)
		pagefault_disable();
	s->quiet = !ng_in_filter(m->filter, m->phys + (addr - m->virt), 1);
	s->decoded = decoded;
	if (decoded)
		s->insn = *insn;
	s->acc.flags = MMIOTNG_F_SINGLESTEP;
	if (decoded && !ng_insn_is_load(insn) && insn->kind != NG_KIND_MOVS) {
		s->acc.op = MMIOTNG_OP_WRITE;
		s->acc.width = insn->mem_width;
		s->acc.value = ng_operand_value(insn, regs);
	}
	if (!decoded || !ng_step_redirect(s, regs, insn)) {
		ng_step_add_page(s, m, addr);
		if (decoded && insn->kind == NG_KIND_MOVS) {
			ng_step_add_operand(s, regs->si, insn->mem_width);
			ng_step_add_operand(s, regs->di, insn->mem_width);
		}
	}
	s->saved_flags = regs->flags & (X86_EFLAGS_TF | X86_EFLAGS_IF);
	s->active = true;
	regs->flags |= X86_EFLAGS_TF;
	regs->flags &= ~X86_EFLAGS_IF;
	this_cpu_inc(ng_stats.singlestepped);
}

/*
 * The stepped instruction faulted on another armed page (an instruction
 * the decoder does not know across a page boundary or between two traced
 * pages; a decoded movs has all its pages present from the start): let it
 * through too.
 * Fault path.
 */
void ng_step_more(struct ng_mapping *m, unsigned long addr)
{
	ng_step_add_page(this_cpu_ptr(&ng_step), m, addr);
}

static void ng_step_finish(struct ng_step *s, struct pt_regs *regs)
{
	struct mmiotng_access *acc = &s->acc;
	unsigned int i;

	for (i = 0; i < s->nredir; i++)
		if (s->redir[i].restore)
			*ng_gpr(regs, s->redir[i].no) -= s->redir[i].delta;
	s->nredir = 0;
	if (s->decoded && ng_insn_is_load(&s->insn)) {
		acc->op = MMIOTNG_OP_READ;
		acc->width = s->insn.mem_width;
		acc->value = ng_operand_value(&s->insn, regs);
		ng_fill_compat(acc, &s->plan, regs);
	} else if (!s->decoded || s->insn.kind == NG_KIND_MOVS) {
		acc->op = MMIOTNG_OP_UNKNOWN;
		acc->width = 0;
		acc->value = 0;
		this_cpu_inc(ng_stats.unknown);
	}
	/*
	 * Stores were filled in when the step started.  The trap is NMI-like:
	 * the record, with the time of the trap, waits for this CPU's irq_work
	 * or its next access (ng_report).
	 */
	if (!s->quiet) {
		acc->ts_ns = ktime_get_mono_fast_ns();
		ng_report(acc);
	}

	if (s->npages) {
		ng_lock_irqs_off();
		for (i = 0; i < s->npages; i++) {
			struct ng_page *pg = s->page[i];

			if (--pg->steppers == 0 && s->map[i]->live)
				ng_page_arm(pg);
		}
		ng_unlock_irqs_off();
		s->npages = 0;
		ng_flush_tlb_local();
		ng_flush_soon();
	}

	regs->flags &= ~(X86_EFLAGS_TF | X86_EFLAGS_IF);
	regs->flags |= s->saved_flags;
	if (s->nofault)
		pagefault_enable();
	s->nofault = false;
	WRITE_ONCE(s->active, false);
}

static int ng_die_notify(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;
	unsigned long *dr6 = (unsigned long *)ERR_PTR(args->err);
	struct ng_step *s = this_cpu_ptr(&ng_step);

	/* ours: this CPU's step, in the task that began it, in the kernel */
	if (val != DIE_DEBUG || !(*dr6 & DR_STEP) || !s->active || s->task != current ||
	    user_mode(args->regs))
		return NOTIFY_DONE;
	ng_step_finish(s, args->regs);
	*dr6 &= ~DR_STEP;
	/*
	 * someone else was stepping too, or a hardware breakpoint hit in the
	 * same instruction: let the trap go on to them
	 */
	if ((args->regs->flags & X86_EFLAGS_TF) || (*dr6 & DR_TRAP_BITS))
		return NOTIFY_DONE;
	return NOTIFY_STOP;
}

static struct notifier_block ng_die_nb = {
	.notifier_call = ng_die_notify,
	.priority = 0x7fffffff,
};

/*
 * Wait until no CPU is in the middle of a single-step.  Process context.
 * A step always ends (it cannot sleep); one that did not would hold the
 * mappings it uses, so this keeps waiting, and says so.
 */
void ng_wait_steps(void)
{
	unsigned long start = jiffies;
	bool said = false;
	int cpu;

	for_each_possible_cpu(cpu) {
		while (READ_ONCE(per_cpu(ng_step, cpu).active)) {
			if (!said && time_after(jiffies, start + 10 * HZ)) {
				pr_err("a single-step on CPU %d has not ended after 10 s\n", cpu);
				said = true;
			}
			usleep_range(100, 200);
		}
	}
}

int ng_step_init(void)
{
	return register_die_notifier(&ng_die_nb);
}

void ng_step_exit(void)
{
	ng_wait_steps();
	unregister_die_notifier(&ng_die_nb);
}
