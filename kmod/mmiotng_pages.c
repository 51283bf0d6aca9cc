// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: page-table entries and mappings.
 *
 * Arming a mapping replaces the page-table entries of its pages (4K, 2M or
 * 1G: a PTE, PMD or PUD) with NG_ARMED_ENTRY, not present, and keeps them;
 * every access then faults (mmiotng_fault.c).  Disarming writes the kept entries back, but
 * only over NG_ARMED_ENTRY (cmpxchg): an iounmap the probe did not see
 * (kprobes disabled) cleared the entry, and the range may have a new owner
 * since.  Entries are otherwise changed with the page-table helpers
 * (set_pte_atomic, set_pmd, set_pud), as the kernel's kmmio does (no
 * paravirt page table: Xen PV is refused at load).
 *
 * Locking in this file:
 *  - Every function that changes an entry, an ng_page or the mapping list
 *    runs under ng_lock (interrupts off): the ioremap and
 *    iounmap probes, the control commands, the single-step path.
 *  - A mapping is put on ng_mappings BEFORE its first entry is cleared and
 *    taken off only AFTER its last entry is restored: a CPU that faults on
 *    a cleared entry always finds the mapping (an ng_find_mapping() under
 *    RCU in the fault path).  The list is RCU: the fault path reads it
 *    locklessly; entries are freed after a grace period by the caller.
 *  - ng_find_filter()/ng_overlaps_filter() read ng_filters: under ng_lock
 *    or ng_mutex (writers hold both).
 *  - Not-present entries are never cached by the TLB, so clearing needs a
 *    flush on every CPU (ng_flush_*) and restoring needs none.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/rculist.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <linux/irq_work.h>
#include <linux/workqueue.h>
#include <asm/pgtable.h>

#include "mmiotng.h"
#include "mmiotng_compat.h"

atomic_t ng_lock_owner = ATOMIC_INIT(-1);	/* ng_lock: its holder's CPU, or -1 */
LIST_HEAD(ng_filters);
LIST_HEAD(ng_mappings);

static void ng_flush_one_cpu(void *unused)
{
	ng_flush_tlb_local();
}

/* Flush every CPU's TLB; process context, interrupts on. */
void ng_flush_all(void)
{
	on_each_cpu(ng_flush_one_cpu, NULL, 1);
}

static DEFINE_PER_CPU(call_single_data_t, ng_flush_csd);

/*
 * Flush this CPU and, without waiting for them, the others; hardirq or
 * process context with interrupts off.  A CPU whose flush is still
 * pending is skipped: that flush runs after the entries changed.
 */
static void ng_flush_now(void)
{
	int cpu, self = smp_processor_id();

	ng_flush_tlb_local();
	for_each_online_cpu(cpu) {
		if (cpu == self)
			continue;
		if (smp_call_function_single_async(cpu, per_cpu_ptr(&ng_flush_csd, cpu)))
			continue;	/* -EBUSY: its flush is still pending */
	}
}

static void ng_flush_irq_work(struct irq_work *w)
{
	ng_flush_now();
}

/* a hard irq_work: it runs in interrupt context on PREEMPT_RT too */
static struct irq_work ng_flush_iw = IRQ_WORK_INIT_HARD(ng_flush_irq_work);

/*
 * Flush every CPU as soon as possible; any context, NMI and the debug trap
 * included: the flush runs from an irq_work on this CPU once interrupts
 * are on again (microseconds), not from a workqueue.
 */
void ng_flush_soon(void)
{
	irq_work_queue(&ng_flush_iw);
}

void ng_flush_init(void)
{
	int cpu;

	for_each_possible_cpu(cpu)
		INIT_CSD(per_cpu_ptr(&ng_flush_csd, cpu), ng_flush_one_cpu, NULL);
}

/*
 * Wait for the flushes queued by ng_flush_soon() (module exit): the
 * irq_work, then every asynchronous flush it sent.
 */
void ng_flush_sync(void)
{
	int cpu;

	irq_work_sync(&ng_flush_iw);
	for_each_possible_cpu(cpu) {
		call_single_data_t *csd = per_cpu_ptr(&ng_flush_csd, cpu);

		while (READ_ONCE(csd->node.u_flags) & CSD_FLAG_LOCK)
			cpu_relax();
	}
}

/*
 * A 1G entry is armed as a 2M one is, one level up: the same not-present
 * value in place of the PUD, no page-table page allocated or freed, nothing
 * split; so a disarm (or a killed session's) only writes one entry back.
 * vunmap treats an armed PUD as an armed PMD: none to pud_none(), not huge
 * to pud_clear_huge() (the iounmap hook disarms before vunmap anyway).
 */
unsigned long ng_level_size(unsigned int level)
{
	switch (level) {
	case PG_LEVEL_1G:
		return PUD_SIZE;
	case PG_LEVEL_2M:
		return PMD_SIZE;
	default:
		return PAGE_SIZE;
	}
}

static void ng_set_entry(struct ng_page *pg, pteval_t val)
{
	switch (pg->level) {
	case PG_LEVEL_1G:
		set_pud((pud_t *)pg->ptep, __pud(val));
		break;
	case PG_LEVEL_2M:
		set_pmd((pmd_t *)pg->ptep, __pmd(val));
		break;
	default:
		set_pte_atomic(pg->ptep, __pte(val));
	}
}

/*
 * What an armed entry holds: not present, and none for pte_none() and
 * pmd_none(), which ignore the accessed and dirty bits of a not-present
 * entry (_PAGE_KNL_ERRATUM_MASK), so vunmap and vmap see an empty entry;
 * but never what vunmap leaves (0) or any present entry.
 */
#define NG_ARMED_ENTRY	((pteval_t)_PAGE_DIRTY)

/* Make one page (4K, 2M or 1G) not-present, keeping its entry.  ng_lock held. */
void ng_page_arm(struct ng_page *pg)
{
	if (pg->armed || pg->lost)
		return;
	pg->saved = pte_val(READ_ONCE(*pg->ptep));
	smp_wmb();	/* a CPU that faults on it reads saved (its window) */
	ng_set_entry(pg, NG_ARMED_ENTRY);
	pg->armed = true;
}

/*
 * Put the saved entry back if the entry is still armed; false, and
 * counted, if something else is there (the page was unmapped unseen):
 * that entry is not ours any more and is left as it is.  ng_lock held.
 */
bool ng_page_disarm(struct ng_page *pg)
{
	pteval_t *entry = &pg->ptep->pte;	/* a 2M or 1G entry: the same 64 bits */
	pteval_t old;
	bool ours;

	BUILD_BUG_ON(NG_ARMED_ENTRY & ~_PAGE_KNL_ERRATUM_MASK);

	if (!pg->armed)
		return true;
	pg->armed = false;
	/*
	 * Knights Landing may set the accessed and dirty bits of a not-present
	 * entry (the erratum pte_none() ignores them for): still ours.
	 */
	old = READ_ONCE(*entry);
	ours = old && !(old & ~_PAGE_KNL_ERRATUM_MASK) &&
	       cmpxchg(entry, old, pg->saved) == old;
	if (!ours) {
		pg->lost = true;	/* never armed again (after a step) */
		this_cpu_inc(ng_stats.stale);
	}
	return ours;
}

/*
 * Put the saved entry back for good, without ng_lock (an NMI-like context,
 * ng_untrap): only over an armed entry (cmpxchg, as ng_page_disarm), and
 * the page is marked lost, so nobody arms it again.  pg->armed stays set:
 * a later disarm finds the entry not armed and leaves it (counted stale).
 * False if the entry is neither armed nor present (unmapped unseen).
 */
bool ng_page_give_back(struct ng_page *pg)
{
	pteval_t *entry = &pg->ptep->pte;	/* a 2M or 1G entry: the same 64 bits */
	pteval_t old = READ_ONCE(*entry);

	WRITE_ONCE(pg->lost, true);
	if (old && !(old & ~_PAGE_KNL_ERRATUM_MASK) && cmpxchg(entry, old, pg->saved) == old)
		return true;
	return READ_ONCE(*entry) & _PAGE_PRESENT;
}

/* The frame an entry of this level maps (the PAT bit of a large entry excluded). */
static unsigned long ng_entry_pfn(pte_t *ptep, unsigned int level)
{
	switch (level) {
	case PG_LEVEL_1G:
		return pud_pfn(*(pud_t *)ptep);
	case PG_LEVEL_2M:
		return pmd_pfn(*(pmd_t *)ptep);
	default:
		return pte_pfn(*ptep);
	}
}

/* Whether the helper arms entries of this level (ng_level_size knows them). */
static bool ng_level_known(unsigned int level)
{
	return level == PG_LEVEL_4K || level == PG_LEVEL_2M || level == PG_LEVEL_1G;
}

/* Whether an entry of this level at addr is one the helper arms. */
static bool ng_level_ok(unsigned long addr, unsigned int level)
{
	return ng_level_known(level) && IS_ALIGNED(addr, ng_level_size(level));
}

/* log2 of the size of m's pages if all are of one size, else 0. */
static u8 ng_uniform_shift(const struct ng_mapping *m)
{
	unsigned int i;

	for (i = 1; i < m->npages; i++)
		if (m->pages[i].level != m->pages[0].level)
			return 0;
	return m->npages ? ilog2(ng_level_size(m->pages[0].level)) : 0;
}

/*
 * Describe the pages of [base, base + len): every one must be present at
 * the 4K, 2M or 1G level and map the physical range the mapping claims.
 * ng_lock held; no entry is changed.
 */
static int ng_collect_pages(struct ng_mapping *m)
{
	unsigned long addr = m->base, end = m->base + m->len;
	phys_addr_t phys_base = m->phys & PAGE_MASK;
	unsigned int n = 0, level;
	pte_t *ptep;

	while (addr < end) {
		if (n >= m->npages)
			return -E2BIG;
		ptep = lookup_address(addr, &level);
		if (!ptep || !pte_present(*ptep))
			return -EFAULT;
		if (!ng_level_ok(addr, level))
			return -EOPNOTSUPP;
		if (ng_entry_pfn(ptep, level) != PHYS_PFN(phys_base + (addr - m->base)))
			return -EINVAL;
		m->pages[n].ptep = ptep;
		m->pages[n].addr = addr;
		m->pages[n].level = level;
		m->pages[n].armed = false;
		m->pages[n].lost = false;
		m->pages[n].steppers = 0;
		addr += ng_level_size(level);
		n++;
	}
	m->npages = n;
	m->page_shift = ng_uniform_shift(m);
	return 0;
}

/*
 * The page of m that holds addr (pages[] is in address order), or NULL:
 * found by its index where all pages are of one size (any mapping of 4K
 * entries), else by a binary search.
 */
struct ng_page *ng_find_page(struct ng_mapping *m, unsigned long addr)
{
	unsigned int lo = 0, hi = m->npages;
	unsigned long i;

	if (m->page_shift) {
		/* below base: a huge index, as past the end */
		i = (addr - m->base) >> m->page_shift;
		return i < m->npages ? &m->pages[i] : NULL;
	}

	while (lo < hi) {
		unsigned int mid = lo + (hi - lo) / 2;
		struct ng_page *pg = &m->pages[mid];

		if (addr < pg->addr)
			hi = mid;
		else if (addr >= pg->addr + ng_level_size(pg->level))
			lo = mid + 1;
		else
			return pg;
	}
	return NULL;
}

/* The mapping that covers addr, under rcu_read_lock or ng_lock. */
struct ng_mapping *ng_find_mapping(unsigned long addr)
{
	struct ng_mapping *m;

	list_for_each_entry_rcu(m, &ng_mappings, node, ng_lock_mine()) {
		if (addr >= m->base && addr < m->base + m->len)
			return m;
	}
	return NULL;
}

/* Whether an armed mapping overlaps [base, base + len).  ng_lock held. */
bool ng_overlaps_mapping(unsigned long base, unsigned long len)
{
	struct ng_mapping *m;

	ng_lock_assert_held();
	list_for_each_entry(m, &ng_mappings, node) {
		if (base < m->base + m->len && m->base < base + len)
			return true;
	}
	return false;
}

/*
 * Whether nothing is mapped at addr: no entry, or a none one that no
 * mapping of the helper covers (an armed entry is none to pte_none()).
 * ng_lock held.
 */
static bool ng_unmapped(unsigned long addr)
{
	unsigned int level;
	pte_t *ptep = lookup_address(addr, &level);

	return (!ptep || pte_none(*ptep)) && !ng_overlaps_mapping(addr, PAGE_SIZE);
}

/*
 * Whether [base, base + len) is a whole ioremap area, not a part of one.
 * Every such area is followed by a guard page that is never mapped, so
 * the page before an area's start is a guard page or free, and so is the
 * page after its last one; a range that starts or ends inside an area has
 * a mapped page there.  (A VM_NO_GUARD area just before a whole one makes
 * it look like a part: refused, which is safe.)  The iounmap hook relies
 * on it: every armed mapping is all of its area.  ng_lock held.
 */
bool ng_whole_area(unsigned long base, unsigned long len)
{
	return ng_unmapped(base - PAGE_SIZE) && ng_unmapped(base + len);
}

/* The filter that contains [phys, phys + size).  ng_lock or ng_mutex. */
struct ng_filter *ng_find_filter(phys_addr_t phys, unsigned long size)
{
	struct ng_filter *f;

	list_for_each_entry(f, &ng_filters, node) {
		if (phys >= f->start && phys - f->start < f->size &&
		    size <= f->size - (phys - f->start))
			return f;
	}
	return NULL;
}

bool ng_overlaps_filter(phys_addr_t phys, unsigned long size)
{
	struct ng_filter *f;

	list_for_each_entry(f, &ng_filters, node) {
		if (phys < f->start + f->size && f->start < phys + size)
			return true;
	}
	return false;
}

/* Entries (4K, 2M or 1G) that map [base, base + len), or a negative errno. */
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
		if (!ng_level_known(level))
			return -EOPNOTSUPP;
		addr = ALIGN_DOWN(addr, ng_level_size(level)) + ng_level_size(level);
		n++;
	}
	return n;
}

/* Bytes of a mapping with room for capacity entries. */
static size_t ng_mapping_bytes(unsigned int capacity)
{
	struct ng_mapping *m;

	return struct_size(m, pages, capacity);
}

/* GFP_KERNEL: kvzalloc; any other flags: kzalloc (kvmalloc's rule). */
static struct ng_mapping *ng_mapping_new(unsigned int capacity, gfp_t gfp)
{
	struct ng_mapping *m = kvzalloc(ng_mapping_bytes(capacity), gfp);

	if (m)
		m->capacity = capacity;
	return m;
}

void ng_mapping_free(struct ng_mapping *m)
{
	kvfree(m);
}

/*
 * Describe a mapping in m: -EFBIG if its pages[] has no room for it (a
 * spare of a huge BAR's filter, for a mapping of more entries than any
 * spare has).  Any context.
 */
int ng_mapping_prepare(struct ng_mapping *m, unsigned long virt, phys_addr_t phys,
		       unsigned long size)
{
	unsigned long base = virt & PAGE_MASK;
	unsigned long len = PAGE_ALIGN((virt & ~PAGE_MASK) + size);
	long npages = ng_count_pages(base, len);

	if (npages < 0)
		return npages;
	if (npages > m->capacity)
		return -EFBIG;
	m->virt = virt;
	m->phys = phys;
	m->size = size;
	m->base = base;
	m->len = len;
	m->npages = npages;
	return 0;
}

/* A mapping described and ready to arm; process context. */
struct ng_mapping *ng_mapping_alloc(unsigned long virt, phys_addr_t phys,
				    unsigned long size, int *err)
{
	long npages = ng_count_pages(virt & PAGE_MASK,
				     PAGE_ALIGN((virt & ~PAGE_MASK) + size));
	struct ng_mapping *m;

	if (npages < 0) {
		*err = npages;
		return NULL;
	}
	m = ng_mapping_new(npages, GFP_KERNEL);
	if (!m) {
		*err = -ENOMEM;
		return NULL;
	}
	*err = ng_mapping_prepare(m, virt, phys, size);
	if (*err) {
		ng_mapping_free(m);
		return NULL;
	}
	return m;
}

/* ---- spare mappings for the ioremap probe ----------------------------- */

/*
 * The ioremap probe runs with preemption off: on PREEMPT_RT the allocator
 * takes sleeping locks there.  So each filter keeps f->spares mappings with
 * room for any mapping of its range (one page more than the range: an
 * unaligned start), allocated in process context.  A driver that maps in a
 * loop while a kernel thread keeps the CPUs busy can still use them up
 * before the refill work runs: outside PREEMPT_RT the probe then allocates
 * one itself (ng_mapping_atomic).
 */
static void ng_spares_refill(struct work_struct *w)
{
	struct ng_filter *f = container_of(w, struct ng_filter, refill);
	struct ng_mapping *m;
	unsigned long flags;

	for (;;) {
		m = ng_mapping_new(f->max_pages, GFP_KERNEL);
		if (!m)
			return;		/* the next ng_spare_get() tries again */
		ng_lock_irqsave(&flags);
		if (f->nspare < f->spares) {
			f->spare[f->nspare++] = m;
			m = NULL;
		}
		ng_unlock_irqrestore(flags);
		if (m) {
			ng_mapping_free(m);
			return;
		}
	}
}

/* Before the filter is listed. */
int ng_spares_init(struct ng_filter *f)
{
	size_t most = (NG_SPARE_MAX_BYTES - ng_mapping_bytes(0)) / sizeof(struct ng_page);
	size_t bytes;

	BUILD_BUG_ON(sizeof(struct ng_page) != 32);
	f->max_pages = min_t(u64, f->page_len / PAGE_SIZE + 1, most);
	/* what the allocator takes for one: kmalloc rounds up to a power of 2 */
	bytes = roundup_pow_of_two(ng_mapping_bytes(f->max_pages));
	f->spares = clamp_t(size_t, NG_SPARE_BYTES / bytes, NG_SPARES_MIN, NG_SPARES_MAX);
	INIT_WORK(&f->refill, ng_spares_refill);
	for (f->nspare = 0; f->nspare < f->spares; f->nspare++) {
		f->spare[f->nspare] = ng_mapping_new(f->max_pages, GFP_KERNEL);
		if (!f->spare[f->nspare]) {
			ng_spares_free(f);
			return -ENOMEM;
		}
	}
	return 0;
}

/*
 * Bytes the spare mappings of every filter ask the allocator for (the
 * STATUS reply: what tracing a range holds beside its armed mappings).
 */
u64 ng_spare_bytes(void)
{
	struct ng_filter *f;
	unsigned long flags;
	u64 bytes = 0;

	ng_lock_irqsave(&flags);
	list_for_each_entry(f, &ng_filters, node)
		bytes += (u64)f->nspare * ng_mapping_bytes(f->max_pages);
	ng_unlock_irqrestore(flags);
	return bytes;
}

/* After the filter is unlisted: no probe can take or give back one. */
void ng_spares_free(struct ng_filter *f)
{
	cancel_work_sync(&f->refill);
	while (f->nspare)
		ng_mapping_free(f->spare[--f->nspare]);
}

/*
 * A spare of f, or NULL; ng_lock held.  Its replacement is on the way (and
 * the refill is asked again when there is none: the last one may have
 * found no memory).
 */
struct ng_mapping *ng_spare_get(struct ng_filter *f)
{
	ng_lock_assert_held();
	schedule_work(&f->refill);
	if (!f->nspare)
		return NULL;
	return f->spare[--f->nspare];
}

/*
 * A mapping with room for one of [virt, virt + size), allocated in the
 * ioremap probe (outside ng_lock) when f has no spare left: NULL on
 * PREEMPT_RT, where the allocator must not be called there, for one larger
 * than PAGE_ALLOC_COSTLY_ORDER, or when there is no memory at once.  Its
 * capacity is below f->max_pages, so it never becomes a spare.
 */
struct ng_mapping *ng_mapping_atomic(unsigned long virt, unsigned long size)
{
	long cap;

	if (IS_ENABLED(CONFIG_PREEMPT_RT))
		return NULL;
	cap = ng_count_pages(virt & PAGE_MASK, PAGE_ALIGN((virt & ~PAGE_MASK) + size));
	if (cap <= 0 || ng_mapping_bytes(cap) > PAGE_SIZE << PAGE_ALLOC_COSTLY_ORDER)
		return NULL;
	return ng_mapping_new(cap, GFP_NOWAIT | __GFP_NOWARN);
}

/*
 * An unmapped mapping, after the grace period that ends its use by the
 * fault path: kept as a spare of its filter when there is room (a driver
 * that maps and unmaps in a loop does not outrun the refill work), freed
 * otherwise.  RCU callback; the filter is still there (ng_teardown waits
 * for these with rcu_barrier() before it frees filters).
 */
void ng_mapping_recycle(struct rcu_head *head)
{
	struct ng_mapping *m = container_of(head, struct ng_mapping, rcu);
	struct ng_filter *f = m->filter;
	unsigned long flags;

	ng_lock_irqsave(&flags);
	if (!f->dying && m->capacity >= f->max_pages && f->nspare < f->spares) {
		f->spare[f->nspare++] = m;
		m = NULL;
	}
	ng_unlock_irqrestore(flags);
	if (m)
		ng_mapping_free(m);
}

/*
 * Give back a spare that ng_spare_get() gave, in the same ng_lock section,
 * and that was not used: its slot is free.
 */
void ng_spare_put(struct ng_filter *f, struct ng_mapping *m)
{
	ng_lock_assert_held();
	if (WARN_ON_ONCE(f->nspare >= f->spares))
		return;		/* leaked: nothing is freed under ng_lock */
	f->spare[f->nspare++] = m;
}

/*
 * Arm a mapping of filter f: findable first, then not-present.  ng_lock
 * held; interrupts are off, so the caller flushes the TLBs afterwards.
 */
int ng_mapping_arm(struct ng_mapping *m, struct ng_filter *f)
{
	unsigned int i;
	int ret;

	ret = ng_collect_pages(m);
	if (ret)
		return ret;
	m->filter = f;
	m->live = true;
	list_add_tail_rcu(&m->node, &ng_mappings);
	for (i = 0; i < m->npages; i++)
		ng_page_arm(&m->pages[i]);
	this_cpu_add(ng_stats.armed_pages, m->npages);
	return 0;
}

/* Restore a mapping's pages, then unlink it.  ng_lock held. */
void ng_mapping_disarm(struct ng_mapping *m)
{
	unsigned int i;

	m->live = false;
	for (i = 0; i < m->npages; i++)
		ng_page_disarm(&m->pages[i]);
	list_del_rcu(&m->node);
	this_cpu_sub(ng_stats.armed_pages, m->npages);
}
