// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the single-step fallback.
 *
 * An instruction the decoder does not know (or every access, in
 * MMIOTNG_MODE_SINGLESTEP) is executed for real: its page is made present,
 * the trap flag set and interrupts kept off, and the debug trap after the
 * instruction reports the access and re-arms the page, as the kernel's
 * kmmio does.  While the page is present other CPUs may use it without
 * faulting: the fallback is for rare instructions.
 *
 * Locking in this file:
 *  - The per-CPU ng_step is only touched by its CPU, in the fault path and
 *    in the debug trap (interrupts off in both).  An NMI that faults on an
 *    armed page while its CPU is stepping joins the step (ng_step_more).
 *  - ng_page.steppers and the entries are changed under ng_lock.
 *  - A stepped mapping stays valid until the trap: ng_wait_steps(), called
 *    by every path that frees mappings, waits for all steps to end.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kdebug.h>
#include <linux/delay.h>
#include <linux/notifier.h>
#include <asm/debugreg.h>
#include <asm/tlbflush.h>

#include "mmiotng.h"
#include "ng_decode.h"

/* Per-CPU state of a single-step in progress. */
struct ng_step {
	struct ng_mapping *map[NG_STEP_PAGES];
	struct ng_page *page[NG_STEP_PAGES];
	unsigned int npages;
	unsigned long ip;	/* the stepped instruction */
	unsigned long saved_flags;
	struct ng_insn insn;
	bool decoded;
	bool active;
	u8 bytes[NG_COMPAT_MAX_BYTES];
	unsigned int nbytes;
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
	raw_spin_lock(&ng_lock);
	pg->steppers++;
	ng_page_disarm(pg);
	raw_spin_unlock(&ng_lock);
	s->map[s->npages] = m;
	s->page[s->npages] = pg;
	s->npages++;
}

/*
 * Make the page present for one instruction and trap right after it.
 * Fault path, interrupts off; the mapping is valid until the trap.
 */
void ng_step_start(struct pt_regs *regs, struct ng_mapping *m,
		   unsigned long addr, const u8 *bytes, unsigned int nbytes,
		   const struct ng_insn *insn, bool decoded)
{
	struct ng_step *s = this_cpu_ptr(&ng_step);

	s->npages = 0;
	ng_step_add_page(s, m, addr);
	s->ip = regs->ip;
	s->decoded = decoded;
	if (decoded)
		s->insn = *insn;
	memcpy(s->bytes, bytes, nbytes);
	s->nbytes = nbytes;
	ng_fill_access(&s->acc, m, addr, regs->ip, bytes, nbytes);
	ng_fill_compat(&s->acc, bytes, nbytes, regs);
	s->acc.flags = MMIOTNG_F_SINGLESTEP;
	if (decoded && !ng_insn_is_load(insn) && insn->kind != NG_KIND_MOVS) {
		s->acc.op = MMIOTNG_OP_WRITE;
		s->acc.width = insn->mem_width;
		s->acc.value = ng_operand_value(insn, regs);
	}
	s->saved_flags = regs->flags & (X86_EFLAGS_TF | X86_EFLAGS_IF);
	s->active = true;
	regs->flags |= X86_EFLAGS_TF;
	regs->flags &= ~X86_EFLAGS_IF;
	this_cpu_inc(ng_stats.singlestepped);
}

/*
 * The stepped instruction faulted on another armed page (a movs between
 * two traced pages, an access across a page boundary), or an NMI did while
 * the step was in progress: let it through too.  Fault path.
 */
void ng_step_more(struct ng_mapping *m, unsigned long addr)
{
	ng_step_add_page(this_cpu_ptr(&ng_step), m, addr);
}

static void ng_step_finish(struct ng_step *s, struct pt_regs *regs)
{
	struct mmiotng_access *acc = &s->acc;
	unsigned int i;

	if (s->decoded && ng_insn_is_load(&s->insn)) {
		acc->op = MMIOTNG_OP_READ;
		acc->width = s->insn.mem_width;
		acc->value = ng_operand_value(&s->insn, regs);
		ng_fill_compat(acc, s->bytes, s->nbytes, regs);
	} else if (!s->decoded || s->insn.kind == NG_KIND_MOVS) {
		acc->op = MMIOTNG_OP_UNKNOWN;
		acc->width = 0;
		acc->value = 0;
		this_cpu_inc(ng_stats.unknown);
	}
	/* stores were filled in when the step started */
	ng_report(acc);

	raw_spin_lock(&ng_lock);
	for (i = 0; i < s->npages; i++) {
		struct ng_page *pg = s->page[i];

		if (--pg->steppers == 0 && s->map[i]->live)
			ng_page_arm(pg);
	}
	raw_spin_unlock(&ng_lock);
	s->npages = 0;
	__flush_tlb_all();
	ng_flush_soon();

	regs->flags &= ~(X86_EFLAGS_TF | X86_EFLAGS_IF);
	regs->flags |= s->saved_flags;
	WRITE_ONCE(s->active, false);
}

static int ng_die_notify(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;
	unsigned long *dr6 = (unsigned long *)ERR_PTR(args->err);
	struct ng_step *s = this_cpu_ptr(&ng_step);

	if (val != DIE_DEBUG || !(*dr6 & DR_STEP) || !s->active)
		return NOTIFY_DONE;
	ng_step_finish(s, args->regs);
	*dr6 &= ~DR_STEP;
	/* someone else was stepping too: let the trap go on to them */
	if (args->regs->flags & X86_EFLAGS_TF)
		return NOTIFY_DONE;
	return NOTIFY_STOP;
}

static struct notifier_block ng_die_nb = {
	.notifier_call = ng_die_notify,
	.priority = 0x7fffffff,
};

/* Wait until no CPU is in the middle of a single-step.  Process context. */
void ng_wait_steps(void)
{
	int cpu;

	for_each_possible_cpu(cpu)
		while (READ_ONCE(per_cpu(ng_step, cpu).active))
			usleep_range(100, 200);
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
