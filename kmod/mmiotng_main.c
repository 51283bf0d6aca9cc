// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the trap engine of mmiotrace-ng.
 *
 * Pages of ioremapped ranges that belong to traced devices are made
 * not-present.  Every access to them faults; the fault reaches
 * bad_area_nosemaphore(), where a kprobe sends the fault to
 * mmiotng_fault() instead.  That decodes the instruction, performs the
 * access through a second mapping of the device (the "shadow", never
 * armed), updates the registers and skips the instruction.  The page stays
 * not-present, so every CPU keeps faulting and no access is missed: no CPU
 * needs to be offlined.  Instructions the decoder does not know are
 * single-stepped with the page present for one instruction, as the kernel's
 * kmmio does, and reported as UNKNOWN.
 *
 * Each access is handed to mmiotng_access_hook(), a noinline function the
 * BPF side of mmiotrace-ng attaches a kprobe to (kmod/mmiotng_abi.h).
 *
 * Control is a generic-netlink family (mmiotng_nl.c).  The socket that adds
 * the first filter owns the session; when it closes, for whatever reason,
 * everything is disarmed.
 *
 * Locking rules:
 *  - ng_mutex serializes every change of the filter and mapping lists
 *    (netlink commands, socket release, module exit).
 *  - ng_lock (raw spinlock, irqsave) guards the lists too and is the only
 *    lock taken in atomic context (the ioremap return probe and the
 *    iounmap probe).  Writers hold both.  Nothing is allocated or freed
 *    under it.
 *  - The fault path takes no lock: it walks the mapping list under RCU (it
 *    runs with interrupts off), and a mapping is freed only after a grace
 *    period.  A filter's shadow mapping is unmapped only after
 *    synchronize_rcu(), so an emulation in flight never uses a stale one.
 *  - A page's saved entry is written back by whoever disarms it, under
 *    ng_lock; the single-step path re-arms under ng_lock too.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/kprobes.h>
#include <linux/slab.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/vmalloc.h>
#include <linux/rculist.h>
#include <linux/percpu.h>
#include <linux/uaccess.h>
#include <linux/sched.h>
#include <linux/kdebug.h>
#include <linux/irq_work.h>
#include <linux/workqueue.h>
#include <linux/delay.h>
#include <asm/tlbflush.h>
#include <asm/debugreg.h>
#include <asm/trap_pf.h>

#include "mmiotng.h"
#include "ng_decode.h"

DEFINE_MUTEX(ng_mutex);		/* see the locking rules above */
static DEFINE_RAW_SPINLOCK(ng_lock);
static LIST_HEAD(ng_filters);
static LIST_HEAD(ng_mappings);
static unsigned int ng_mode = MMIOTNG_MODE_EMULATE;
DEFINE_PER_CPU(struct ng_stats, ng_stats);

/* Per-CPU state of a single-step in progress. */
struct ng_step {
	struct ng_mapping *map;
	struct ng_page *page;
	struct ng_mapping *map2;
	struct ng_page *page2;
	unsigned long addr;
	unsigned long saved_flags;
	struct ng_insn insn;
	bool decoded;
	bool active;
	u8 bytes[NG_COMPAT_MAX_BYTES];
	unsigned int nbytes;
	struct mmiotng_access acc;
};

static DEFINE_PER_CPU(struct ng_step, ng_step);

/* The attach point for BPF: must stay a real call. */
noinline void mmiotng_access_hook(const struct mmiotng_access *a)
{
	asm volatile("" : : "r"(a) : "memory");
}
EXPORT_SYMBOL_GPL(mmiotng_access_hook);

static void ng_flush_one_cpu(void *unused)
{
	__flush_tlb_all();
}

/* Flush every CPU's TLB; needs interrupts on (IPIs with wait). */
static void ng_flush_all(void)
{
	on_each_cpu(ng_flush_one_cpu, NULL, 1);
}

/*
 * After a single-step re-armed a page from the debug trap, other CPUs may
 * still hold the present translation they used during the step: flush them
 * from process context, as soon as possible.
 */
static void ng_flush_workfn(struct work_struct *w)
{
	ng_flush_all();
}

static DECLARE_WORK(ng_flush_work, ng_flush_workfn);

static void ng_flush_irq_work(struct irq_work *w)
{
	schedule_work(&ng_flush_work);
}

static DEFINE_IRQ_WORK(ng_flush_iw, ng_flush_irq_work);

/* ---- pages ---------------------------------------------------------- */

static unsigned long ng_level_size(unsigned int level)
{
	return level == PG_LEVEL_2M ? PMD_SIZE : PAGE_SIZE;
}

/* Make one page (4K or 2M) not-present, keeping its entry.  ng_lock held. */
static void ng_page_arm(struct ng_page *pg)
{
	if (pg->armed)
		return;
	pg->saved = pte_val(READ_ONCE(*pg->ptep));
	WRITE_ONCE(*pg->ptep, __pte(0));
	pg->armed = true;
}

/* Put the saved entry back.  ng_lock held, or the single-step path. */
static void ng_page_disarm(struct ng_page *pg)
{
	if (!pg->armed)
		return;
	WRITE_ONCE(*pg->ptep, __pte(pg->saved));
	pg->armed = false;
}

/*
 * Describe the pages of [base, base + len): every one must be present at
 * the 4K or 2M level.  Process or atomic context; no page is changed.
 */
static int ng_collect_pages(struct ng_mapping *m, phys_addr_t phys_base)
{
	unsigned long addr = m->base, end = m->base + m->len;
	unsigned int n = 0, level;
	pte_t *ptep;

	while (addr < end) {
		if (n >= m->npages)
			return -E2BIG;
		ptep = lookup_address(addr, &level);
		if (!ptep || !pte_present(*ptep))
			return -EFAULT;
		if (level != PG_LEVEL_4K && level != PG_LEVEL_2M)
			return -EOPNOTSUPP;
		if (level == PG_LEVEL_2M && !IS_ALIGNED(addr, PMD_SIZE))
			return -EOPNOTSUPP;
		/* The entry must map what the caller says it maps. */
		if (phys_base &&
		    pte_pfn(*ptep) != PHYS_PFN(phys_base + (addr - m->base)))
			return -EINVAL;
		m->pages[n].ptep = ptep;
		m->pages[n].addr = addr;
		m->pages[n].level = level;
		m->pages[n].armed = false;
		addr += ng_level_size(level);
		n++;
	}
	m->npages = n;
	return 0;
}

static struct ng_page *ng_find_page(struct ng_mapping *m, unsigned long addr)
{
	unsigned int i;

	for (i = 0; i < m->npages; i++) {
		struct ng_page *pg = &m->pages[i];

		if (addr >= pg->addr && addr < pg->addr + ng_level_size(pg->level))
			return pg;
	}
	return NULL;
}

/* ---- mappings ------------------------------------------------------- */

/* The mapping that covers addr, under rcu_read_lock or ng_lock. */
static struct ng_mapping *ng_find_mapping(unsigned long addr)
{
	struct ng_mapping *m;

	list_for_each_entry_rcu(m, &ng_mappings, node, lockdep_is_held(&ng_lock)) {
		if (addr >= m->base && addr < m->base + m->len)
			return m;
	}
	return NULL;
}

static struct ng_filter *ng_find_filter(phys_addr_t phys, unsigned long size)
{
	struct ng_filter *f;

	list_for_each_entry(f, &ng_filters, node) {
		if (phys >= f->start && phys - f->start < f->size &&
		    size <= f->size - (phys - f->start))
			return f;
	}
	return NULL;
}

static bool ng_overlaps_filter(phys_addr_t phys, unsigned long size)
{
	struct ng_filter *f;

	list_for_each_entry(f, &ng_filters, node) {
		if (phys < f->start + f->size && f->start < phys + size)
			return true;
	}
	return false;
}

/* Entries (4K or 2M) that map [base, base + len), or a negative errno. */
static long ng_count_pages(unsigned long base, unsigned long len)
{
	unsigned long addr = base;
	unsigned int level;
	long n = 0;
	pte_t *ptep;

	while (addr < base + len) {
		ptep = lookup_address(addr, &level);
		if (!ptep || !pte_present(*ptep))
			return -EFAULT;
		if (level != PG_LEVEL_4K && level != PG_LEVEL_2M)
			return -EOPNOTSUPP;
		addr = ALIGN_DOWN(addr, ng_level_size(level)) + ng_level_size(level);
		n++;
	}
	return n;
}

static struct ng_mapping *ng_mapping_alloc(unsigned long virt, phys_addr_t phys,
					   unsigned long size, gfp_t gfp, int *err)
{
	unsigned long base = virt & PAGE_MASK;
	unsigned long len = PAGE_ALIGN((virt & ~PAGE_MASK) + size);
	struct ng_mapping *m;
	long npages = ng_count_pages(base, len);

	if (npages < 0) {
		*err = npages;
		return NULL;
	}
	m = kzalloc(struct_size(m, pages, npages), gfp);
	if (!m) {
		*err = -ENOMEM;
		return NULL;
	}
	m->virt = virt;
	m->phys = phys;
	m->size = size;
	m->base = base;
	m->len = len;
	m->npages = npages;
	return m;
}

/*
 * Arm a new mapping of a filtered range.  ng_lock held; interrupts may be
 * off, so the caller flushes the TLBs afterwards.
 */
static int ng_mapping_arm(struct ng_mapping *m, struct ng_filter *f)
{
	unsigned int i;
	int ret;

	ret = ng_collect_pages(m, m->phys & PAGE_MASK);
	if (ret)
		return ret;
	m->filter = f;
	for (i = 0; i < m->npages; i++)
		ng_page_arm(&m->pages[i]);
	m->live = true;
	list_add_tail_rcu(&m->node, &ng_mappings);
	this_cpu_add(ng_stats.armed_pages, m->npages);
	return 0;
}

/* Restore a mapping's pages and unlink it.  ng_lock held. */
static void ng_mapping_disarm(struct ng_mapping *m)
{
	unsigned int i;

	m->live = false;
	for (i = 0; i < m->npages; i++)
		ng_page_disarm(&m->pages[i]);
	list_del_rcu(&m->node);
	this_cpu_sub(ng_stats.armed_pages, m->npages);
}

/* ---- ioremap / iounmap probes ----------------------------------------- */

struct ng_ioremap_args {
	phys_addr_t phys;
	unsigned long size;
};

static int ng_ioremap_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ng_ioremap_args *a = (void *)ri->data;

	a->phys = regs_get_kernel_argument(regs, 0);
	a->size = regs_get_kernel_argument(regs, 1);
	return 0;
}

/*
 * __ioremap_caller() returned: arm the new mapping before the driver can
 * use it.  Runs with preemption off: GFP_ATOMIC only.
 */
static int ng_ioremap_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ng_ioremap_args *a = (void *)ri->data;
	unsigned long virt = regs_return_value(regs);
	struct ng_mapping *m;
	struct ng_filter *f;
	unsigned long flags;
	int ret;

	if (!virt || list_empty(&ng_filters))
		return 0;

	/*
	 * Allocated before ng_lock is taken, not under it: a raw spinlock is
	 * no place for the allocator.  Freed again if no filter wants it.
	 */
	m = ng_mapping_alloc(virt, a->phys, a->size, GFP_ATOMIC, &ret);
	raw_spin_lock_irqsave(&ng_lock, flags);
	f = ng_find_filter(a->phys, a->size);
	if (!f) {
		if (ng_overlaps_filter(a->phys, a->size))
			this_cpu_inc(ng_stats.refused);
		raw_spin_unlock_irqrestore(&ng_lock, flags);
		kfree(m);
		return 0;
	}
	if (m)
		ret = ng_mapping_arm(m, f);
	raw_spin_unlock_irqrestore(&ng_lock, flags);

	if (ret) {
		kfree(m);
		this_cpu_inc(ng_stats.refused);
		pr_warn_ratelimited("cannot trace ioremap of %pa (+0x%lx): %d\n",
				    &a->phys, a->size, ret);
		return 0;
	}
	if (irqs_disabled())
		irq_work_queue(&ng_flush_iw);
	else
		ng_flush_all();
	return 0;
}

static struct kretprobe ng_ioremap_probe = {
	.kp.symbol_name = "__ioremap_caller",
	.entry_handler = ng_ioremap_entry,
	.handler = ng_ioremap_ret,
	.data_size = sizeof(struct ng_ioremap_args),
	.maxactive = 64,
};

static void ng_free_rcu(struct rcu_head *head)
{
	kfree(container_of(head, struct ng_mapping, rcu));
}

/* iounmap() entry: put the pages back before the area is freed. */
static int ng_iounmap_pre(struct kprobe *p, struct pt_regs *regs)
{
	unsigned long addr = regs_get_kernel_argument(regs, 0);
	struct ng_mapping *m;
	unsigned long flags;

	if (list_empty(&ng_mappings))
		return 0;
	raw_spin_lock_irqsave(&ng_lock, flags);
	m = ng_find_mapping(addr);
	if (m && m->base == (addr & PAGE_MASK))
		ng_mapping_disarm(m);
	else
		m = NULL;
	raw_spin_unlock_irqrestore(&ng_lock, flags);
	if (m)
		call_rcu(&m->rcu, ng_free_rcu);
	return 0;
}

static struct kprobe ng_iounmap_probe = {
	.symbol_name = "iounmap",
	.pre_handler = ng_iounmap_pre,
};

/* ---- recording ------------------------------------------------------ */

static void ng_fill_access(struct mmiotng_access *acc, const struct ng_mapping *m,
			   unsigned long addr, unsigned long ip,
			   const u8 *bytes, unsigned int nbytes)
{
	memset(acc, 0, sizeof(*acc));
	acc->map_virt = m->virt;
	acc->phys = m->phys + (addr - m->virt);
	acc->ip = ip;
	acc->insn_len = min_t(unsigned int, nbytes, MMIOTNG_INSN_BYTES);
	memcpy(acc->insn, bytes, acc->insn_len);
}

/* What the kernel's mmiotrace would print for this access. */
static void ng_fill_compat(struct mmiotng_access *acc, const u8 *bytes,
			   unsigned int nbytes, const struct pt_regs *regs)
{
	u8 op, width;
	u64 value;

	ng_compat(bytes, nbytes, regs, &op, &width, &value);
	acc->compat_op = op;
	acc->compat_width = width;
	acc->compat_value = value;
}

/* ---- emulation ------------------------------------------------------ */

struct ng_emu_ctx {
	struct pt_regs *regs;
	const u8 *bytes;
	unsigned int nbytes;
	const struct ng_insn *insn;
	/* a load waits for the registers it sets before it is reported */
	bool pending;
	struct mmiotng_access acc;
};

static bool ng_is_string(const struct ng_insn *insn)
{
	return insn->kind == NG_KIND_MOVS || insn->kind == NG_KIND_STOS;
}

/* Translate addr of an armed mapping to the shadow; NULL if not MMIO. */
static void __iomem *ng_shadow(unsigned long addr, unsigned int width,
			       struct ng_mapping **mp)
{
	struct ng_mapping *m = ng_find_mapping(addr);
	phys_addr_t phys;

	if (!m)
		return NULL;
	phys = m->phys + (addr - m->virt);
	if (phys < m->filter->start ||
	    phys + width > m->filter->start + m->filter->size)
		return NULL;
	*mp = m;
	return m->filter->shadow + (phys - m->filter->start);
}

/* The access itself, through the shadow; width is 1, 2, 4 or 8 (ng_emulate). */
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
	mmiotng_access_hook(&c->acc);
	c->pending = false;
}

/* Describe an access made through the shadow in c->acc. */
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

static int ng_emu_read(void *ctx, unsigned long addr, unsigned int width, u64 *val)
{
	struct ng_emu_ctx *c = ctx;
	struct ng_mapping *m;
	void __iomem *io = ng_shadow(addr, width, &m);

	if (c->pending)
		ng_emit(c);
	if (!io) {
		/* the other operand of a movs: ordinary kernel memory */
		if (addr < TASK_SIZE_MAX)
			return -EFAULT;
		*val = 0;
		return copy_from_kernel_nofault(val, (void *)addr, width);
	}
	*val = ng_io_read(io, width);
	ng_describe(c, m, addr, MMIOTNG_OP_READ, width, *val);
	/*
	 * String reads are unknown to the kernel's decoder whatever the
	 * registers hold; a plain load is reported once its register is set.
	 */
	if (ng_is_string(c->insn)) {
		ng_fill_compat(&c->acc, c->bytes, c->nbytes, c->regs);
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
	void __iomem *io = ng_shadow(addr, width, &m);

	if (c->pending)
		ng_emit(c);
	if (!io) {
		if (addr < TASK_SIZE_MAX)
			return -EFAULT;
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
	ng_describe(c, m, addr, MMIOTNG_OP_WRITE, width, val);
	/* the kernel's tracer sees the registers as they are before the store */
	ng_fill_compat(&c->acc, c->bytes, c->nbytes, c->regs);
	ng_io_write(io, width, val);
	ng_emit(c);
	return 0;
}

static const struct ng_mem_ops ng_emu_ops = {
	.read = ng_emu_read,
	.write = ng_emu_write,
};

/* Elements of a rep string instruction emulated per fault (IRQs are off). */
#define NG_REP_CHUNK	256

/* Emulate the faulting instruction; false if it must be single-stepped. */
static bool ng_emulate_fault(struct pt_regs *regs, unsigned long addr,
			     const u8 *bytes, unsigned int nbytes,
			     const struct ng_insn *insn)
{
	struct ng_emu_ctx c = {
		.regs = regs, .bytes = bytes, .nbytes = nbytes, .insn = insn,
	};
	int ret;

	ret = ng_emulate(insn, regs, addr, &ng_emu_ops, &c, NG_REP_CHUNK);
	if (c.pending) {
		/* the load is done and its register set: report it now */
		ng_fill_compat(&c.acc, bytes, nbytes, regs);
		ng_emit(&c);
	}
	/* a partial rep resumes when the instruction faults again */
	return ret == 0 || ret == NG_EMU_PARTIAL;
}

static bool ng_insn_is_load(const struct ng_insn *insn)
{
	return insn->kind == NG_KIND_LOAD || insn->kind == NG_KIND_MOVZX ||
	       insn->kind == NG_KIND_MOVSX;
}

/* ---- single-step fallback ------------------------------------------- */

/*
 * Make the page present for one instruction and trap right after it.
 * Other CPUs may use the page without faulting meanwhile: the fallback is
 * for rare instructions only.  Interrupts stay off during the step.
 */
static void ng_singlestep_start(struct pt_regs *regs, struct ng_mapping *m,
				unsigned long addr, const u8 *bytes,
				unsigned int nbytes, const struct ng_insn *insn,
				bool decoded)
{
	struct ng_step *s = this_cpu_ptr(&ng_step);
	struct ng_page *pg = ng_find_page(m, addr);

	raw_spin_lock(&ng_lock);
	if (pg)
		pg->steppers++;
	if (pg && pg->armed)
		ng_page_disarm(pg);
	raw_spin_unlock(&ng_lock);

	s->map = m;
	s->page = pg;
	s->addr = addr;
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

/* A stepping CPU is done with pg: re-arm it if nobody else steps on it. */
static void ng_step_release(struct ng_mapping *m, struct ng_page *pg)
{
	if (pg && --pg->steppers == 0 && m->live)
		ng_page_arm(pg);
}

/*
 * The stepped instruction faulted on a second armed page (a movs between
 * two traced ranges): let it through too, unreported.
 */
static void ng_singlestep_second(struct ng_step *s, struct ng_mapping *m,
				 unsigned long addr)
{
	struct ng_page *pg = ng_find_page(m, addr);

	raw_spin_lock(&ng_lock);
	if (pg && !s->page2) {
		pg->steppers++;
		ng_page_disarm(pg);
		s->map2 = m;
		s->page2 = pg;
	}
	raw_spin_unlock(&ng_lock);
	this_cpu_inc(ng_stats.unknown);
}

static void ng_singlestep_finish(struct ng_step *s, struct pt_regs *regs)
{
	struct mmiotng_access *acc = &s->acc;

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
	mmiotng_access_hook(acc);

	raw_spin_lock(&ng_lock);
	ng_step_release(s->map, s->page);
	ng_step_release(s->map2, s->page2);
	s->map2 = NULL;
	s->page2 = NULL;
	raw_spin_unlock(&ng_lock);
	__flush_tlb_all();
	irq_work_queue(&ng_flush_iw);

	regs->flags &= ~(X86_EFLAGS_TF | X86_EFLAGS_IF);
	regs->flags |= s->saved_flags;
	s->active = false;
}

static int ng_die_notify(struct notifier_block *nb, unsigned long val, void *data)
{
	struct die_args *args = data;
	unsigned long *dr6 = (unsigned long *)ERR_PTR(args->err);
	struct ng_step *s = this_cpu_ptr(&ng_step);

	if (val != DIE_DEBUG || !(*dr6 & DR_STEP) || !s->active)
		return NOTIFY_DONE;
	ng_singlestep_finish(s, args->regs);
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

typedef void (*ng_bad_area_fn)(struct pt_regs *, unsigned long, unsigned long);
static struct kprobe ng_fault_probe;

/*
 * Runs in place of bad_area_nosemaphore() for faults on armed pages, in
 * the page-fault exception with interrupts off.  Must not sleep.
 */
static void ng_fault(struct pt_regs *regs, unsigned long error_code,
		     unsigned long address)
{
	struct ng_insn insn;
	struct ng_mapping *m;
	unsigned int nbytes;
	bool decoded;
	u8 bytes[NG_COMPAT_MAX_BYTES];

	this_cpu_inc(ng_stats.faults);
	rcu_read_lock();
	m = ng_find_mapping(address);
	if (m && this_cpu_read(ng_step.active)) {
		ng_singlestep_second(this_cpu_ptr(&ng_step), m, address);
		rcu_read_unlock();
		return;
	}
	if (!m) {
		pte_t *ptep;
		unsigned int level;

		rcu_read_unlock();
		/* disarmed meanwhile by another CPU: just retry the access */
		ptep = lookup_address(address, &level);
		if (ptep && pte_present(*ptep))
			return;
		/* not ours: the kernel's own handling (the probe lets it pass) */
		((ng_bad_area_fn)ng_fault_probe.addr)(regs, error_code, address);
		return;
	}

	nbytes = ng_fetch_insn(regs->ip, bytes);
	decoded = nbytes && ng_decode(bytes, nbytes, &insn) == 0;
	if (decoded && READ_ONCE(ng_mode) == MMIOTNG_MODE_EMULATE &&
	    ng_emulate_fault(regs, address, bytes, nbytes, &insn)) {
		this_cpu_inc(ng_stats.emulated);
		rcu_read_unlock();
		return;
	}
	/* the step's mapping stays valid: freeing waits for the debug trap */
	ng_singlestep_start(regs, m, address, bytes, nbytes, &insn, decoded);
	rcu_read_unlock();
}

/* Runs in place of bad_area_nosemaphore() for a fault that raced a disarm. */
static void ng_fault_retry(struct pt_regs *regs, unsigned long error_code,
			   unsigned long address)
{
	this_cpu_inc(ng_stats.retried);
}

/*
 * kprobe on bad_area_nosemaphore(regs, error_code, address): for a
 * not-present kernel-mode fault on an armed page, run ng_fault() instead.
 */
static int ng_fault_pre(struct kprobe *p, struct pt_regs *kregs)
{
	struct pt_regs *regs = (struct pt_regs *)regs_get_kernel_argument(kregs, 0);
	unsigned long error_code = regs_get_kernel_argument(kregs, 1);
	unsigned long address = regs_get_kernel_argument(kregs, 2);
	unsigned int level;
	pte_t *ptep;
	bool ours;

	if (error_code & (X86_PF_PROT | X86_PF_USER | X86_PF_RSVD | X86_PF_INSTR |
			  X86_PF_PK))
		return 0;
	if (!is_vmalloc_addr((void *)address) || user_mode(regs))
		return 0;
	rcu_read_lock();
	ours = !!ng_find_mapping(address);
	rcu_read_unlock();
	if (ours) {
		/* the ftrace trampoline calls ng_fault() with the same arguments */
		instruction_pointer_set(kregs, (unsigned long)ng_fault);
		return 1;
	}
	/*
	 * A page disarmed on another CPU between this fault and now is present
	 * again: the access only needs to be retried.  Not-present entries are
	 * never cached, so nothing else makes such a fault.
	 */
	ptep = lookup_address(address, &level);
	if (!ptep || !pte_present(*ptep))
		return 0;
	instruction_pointer_set(kregs, (unsigned long)ng_fault_retry);
	return 1;
}

static struct kprobe ng_fault_probe = {
	.symbol_name = "bad_area_nosemaphore",
	.pre_handler = ng_fault_pre,
};

/* ---- control (called by mmiotng_nl.c with ng_mutex held) ------------- */

int ng_filter_add(phys_addr_t start, u64 size)
{
	struct ng_filter *f;
	unsigned long flags;

	lockdep_assert_held(&ng_mutex);
	if (!size || size > NG_MAX_FILTER_SIZE || start + size < start ||
	    !PAGE_ALIGNED(start) || !PAGE_ALIGNED(size))
		return -EINVAL;
	if (ng_nr_filters() >= NG_MAX_FILTERS)
		return -ENOSPC;
	if (ng_overlaps_filter(start, size))
		return -EEXIST;
	/* device memory only: ioremap of RAM warns, and is never MMIO */
	if (region_intersects(start, size, IORESOURCE_SYSTEM_RAM,
			      IORES_DESC_NONE) != REGION_DISJOINT)
		return -EINVAL;
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	f->start = start;
	f->size = size;
	f->shadow = ioremap(start, size);
	if (!f->shadow) {
		kfree(f);
		return -ENOMEM;
	}
	raw_spin_lock_irqsave(&ng_lock, flags);
	list_add_tail(&f->node, &ng_filters);
	raw_spin_unlock_irqrestore(&ng_lock, flags);
	return 0;
}

unsigned int ng_nr_filters(void)
{
	struct ng_filter *f;
	unsigned int n = 0;

	list_for_each_entry(f, &ng_filters, node)
		n++;
	return n;
}

/* Disarm and free the mappings of f (all mappings if f is NULL). */
static void ng_disarm_mappings(struct ng_filter *f)
{
	struct ng_mapping *m, *tmp;
	unsigned long flags;
	LIST_HEAD(dead);

	raw_spin_lock_irqsave(&ng_lock, flags);
	list_for_each_entry_safe(m, tmp, &ng_mappings, node) {
		if (f && m->filter != f)
			continue;
		ng_mapping_disarm(m);
		list_add(&m->dead, &dead);
	}
	raw_spin_unlock_irqrestore(&ng_lock, flags);
	/* no CPU can still be emulating through them after this */
	synchronize_rcu();
	ng_wait_steps();
	list_for_each_entry_safe(m, tmp, &dead, dead)
		kfree(m);
}

static void ng_filter_free(struct ng_filter *f)
{
	unsigned long flags;

	ng_disarm_mappings(f);
	raw_spin_lock_irqsave(&ng_lock, flags);
	list_del(&f->node);
	raw_spin_unlock_irqrestore(&ng_lock, flags);
	synchronize_rcu();
	iounmap(f->shadow);
	kfree(f);
}

int ng_filter_del(phys_addr_t start, u64 size)
{
	struct ng_filter *f;

	lockdep_assert_held(&ng_mutex);
	list_for_each_entry(f, &ng_filters, node) {
		if (f->start == start && f->size == size) {
			ng_filter_free(f);
			return 0;
		}
	}
	return -ENOENT;
}

/* Whether [virt, virt + size) overlaps a shadow: arming one would recurse. */
static bool ng_is_shadow(unsigned long virt, u64 size)
{
	struct ng_filter *f;

	list_for_each_entry(f, &ng_filters, node) {
		unsigned long s = (unsigned long)f->shadow;

		if (virt < s + f->size && s < virt + size)
			return true;
	}
	return false;
}

/* Arm a mapping made before tracing started (found in /proc/vmallocinfo). */
int ng_arm_existing(unsigned long virt, u64 size, phys_addr_t phys)
{
	struct ng_mapping *m;
	struct ng_filter *f;
	unsigned long flags;
	int ret;

	lockdep_assert_held(&ng_mutex);
	if (!size || size > NG_MAX_FILTER_SIZE || virt + size < virt ||
	    !is_vmalloc_addr((void *)virt) || !is_vmalloc_addr((void *)(virt + size - 1)) ||
	    (virt & ~PAGE_MASK) != (phys & ~PAGE_MASK))
		return -EINVAL;
	f = ng_find_filter(phys, size);
	if (!f)
		return -ENOENT;
	if (ng_is_shadow(virt, size))
		return -EPERM;
	m = ng_mapping_alloc(virt, phys, size, GFP_KERNEL, &ret);
	if (!m)
		return ret;
	raw_spin_lock_irqsave(&ng_lock, flags);
	if (ng_find_mapping(m->base) || ng_find_mapping(m->base + m->len - 1))
		ret = -EEXIST;
	else
		ret = ng_mapping_arm(m, f);
	raw_spin_unlock_irqrestore(&ng_lock, flags);
	if (ret) {
		kfree(m);
		return ret;
	}
	ng_flush_all();
	return 0;
}

void ng_disarm_all(void)
{
	struct ng_filter *f, *tmp;

	lockdep_assert_held(&ng_mutex);
	ng_disarm_mappings(NULL);
	list_for_each_entry_safe(f, tmp, &ng_filters, node)
		ng_filter_free(f);
	WRITE_ONCE(ng_mode, MMIOTNG_MODE_EMULATE);
}

int ng_set_mode(u32 mode)
{
	if (mode != MMIOTNG_MODE_EMULATE && mode != MMIOTNG_MODE_SINGLESTEP)
		return -EINVAL;
	WRITE_ONCE(ng_mode, mode);
	return 0;
}

/* Wait until no CPU is in the middle of a single-step. */
void ng_wait_steps(void)
{
	int cpu;

	for_each_possible_cpu(cpu)
		while (READ_ONCE(per_cpu(ng_step, cpu).active))
			usleep_range(100, 200);
}

void ng_get_stats(struct ng_stats *sum)
{
	struct ng_mapping *m;
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
	}
	sum->filters = ng_nr_filters();
	rcu_read_lock();
	list_for_each_entry_rcu(m, &ng_mappings, node)
		sum->mappings++;
	rcu_read_unlock();
}

/* ---- module --------------------------------------------------------- */

static int __init ng_init(void)
{
	int ret;

	ret = register_die_notifier(&ng_die_nb);
	if (ret)
		return ret;
	ret = register_kprobe(&ng_fault_probe);
	if (ret) {
		pr_err("cannot probe %s: %d\n", ng_fault_probe.symbol_name, ret);
		goto err_die;
	}
	ret = register_kprobe(&ng_iounmap_probe);
	if (ret) {
		pr_err("cannot probe iounmap: %d\n", ret);
		goto err_fault;
	}
	ret = register_kretprobe(&ng_ioremap_probe);
	if (ret) {
		pr_err("cannot probe %s: %d\n", ng_ioremap_probe.kp.symbol_name, ret);
		goto err_iounmap;
	}
	ret = ng_hooks_init();
	if (ret)
		goto err_ioremap;
	ret = ng_nl_init();
	if (ret)
		goto err_hooks;
	return 0;

err_hooks:
	ng_hooks_exit();
err_ioremap:
	unregister_kretprobe(&ng_ioremap_probe);
err_iounmap:
	unregister_kprobe(&ng_iounmap_probe);
err_fault:
	unregister_kprobe(&ng_fault_probe);
err_die:
	unregister_die_notifier(&ng_die_nb);
	return ret;
}

static void __exit ng_exit(void)
{
	/* no new commands, then nothing armed, then no probes */
	ng_nl_exit();
	ng_hooks_exit();
	mutex_lock(&ng_mutex);
	ng_disarm_all();
	mutex_unlock(&ng_mutex);
	unregister_kretprobe(&ng_ioremap_probe);
	unregister_kprobe(&ng_iounmap_probe);
	unregister_kprobe(&ng_fault_probe);
	ng_wait_steps();
	unregister_die_notifier(&ng_die_nb);
	irq_work_sync(&ng_flush_iw);
	flush_work(&ng_flush_work);
	rcu_barrier();
}

module_init(ng_init);
module_exit(ng_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("mmiotrace-ng trap engine: traces MMIO of chosen devices");
