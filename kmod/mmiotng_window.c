// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the windows the fault path reaches the device through.
 *
 * An emulated access (and a single-step against a moved register) goes to
 * the device through a window of the CPU that emulates: the window's
 * page-table entry is the armed entry itself (the frame and the memory
 * type the driver's mapping has: UC-, WC, WT, ...), made present.  A
 * window is two pages: an access across a page boundary (a readl at
 * 0xffe) goes through both, the second showing the next device page, so
 * it is emulated like any other and no device page is made present.
 * Nothing is ioremapped for tracing, so no memory type is reserved and a
 * driver's own ioremap_wc() or memremap() of a traced BAR keeps its type;
 * and every access is made with the type the driver asked for.
 *
 * Locking in this file:
 *  - Each CPU has a window per nesting level (NG_LEVELS): one for the
 *    fault path of tasks and interrupts (interrupts off), one for an NMI
 *    or a kprobe's int3 handler on top of it, and so on; a context never
 *    uses the window of the one it interrupted.  A window is only used by
 *    its CPU, at its level, with interrupts off, so it needs no lock; its
 *    entry is rewritten (and the CPU's TLB entry for it dropped) only when
 *    the page it shows changes, or when the CPU uses it under another PCID
 *    than last time (ng_window_tlb.h says why).
 *  - ng_windows_reset() runs in process context after a grace period in
 *    which no CPU can be emulating (ng_teardown): it puts every window's
 *    original entry back, so that no device page stays mapped.  It runs
 *    when the session's last filter goes; until then a window may keep
 *    showing a page of a filter that went (a device removed meanwhile),
 *    with the memory type its driver had (UC- for an ioremap()).
 *  - ng_page_at(), ng_device_at() and ng_device_addr() run in the fault
 *    and single-step paths, interrupts off, under RCU: the mappings they
 *    find are freed only after a grace period.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/err.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/vmalloc.h>
#include <linux/preempt.h>
#include <linux/delay.h>
#include <linux/moduleparam.h>
#include <asm/pgtable.h>
#include <asm/tlbflush.h>

#include "mmiotng.h"
#include "ng_window_tlb.h"

#define NG_WINDOWS	NG_LEVELS	/* per CPU: one per nesting level */
#define NG_WINDOW_PAGES	2		/* the second for an access across a page */

struct ng_window {
	unsigned long va;
	pte_t *ptep[NG_WINDOW_PAGES];
	pteval_t orig[NG_WINDOW_PAGES];		/* the entries vmalloc gave it */
	struct ng_window_tlb tlb[NG_WINDOW_PAGES];	/* the entries now, and where */
};

static DEFINE_PER_CPU(struct ng_window [NG_WINDOWS], ng_windows);
static void *ng_window_area;

static unsigned int test_window_hold_us;
module_param(test_window_hold_us, uint, 0444);
MODULE_PARM_DESC(test_window_hold_us,
		 "tests: spin this long after a window is set, before the access through it (races with a change of the window then show)");

/*
 * Drop this CPU's TLB entry for va in the current PCID (and a global one):
 * flush_tlb_one_kernel is not exported.
 */
static void ng_invlpg(unsigned long va)
{
	asm volatile("invlpg (%0)" : : "r" (va) : "memory");
}

/* The PCID of this CPU's address space now (0 without PCID). */
static unsigned long ng_cur_pcid(void)
{
	return __native_read_cr3() & X86_CR3_PCID_MASK;
}

/*
 * The present 4K entry that shows the page of addr, from the armed entry
 * pg->saved: a 2M or 1G entry gives the frame of addr inside it, and its
 * PAT bit (bit 12) becomes the 4K PAT bit (bit 7, which is PSE in a large
 * entry).
 */
static pteval_t ng_large_entry(const struct ng_page *pg, unsigned long addr)
{
	pteval_t v = pg->saved, flags = v & PTE_FLAGS_MASK & ~_PAGE_PSE;
	phys_addr_t frame;

	frame = (v & PTE_PFN_MASK & ~(phys_addr_t)(ng_level_size(pg->level) - 1)) +
		((addr - pg->addr) & PAGE_MASK);
	if (v & _PAGE_PAT_LARGE)
		flags |= _PAGE_PAT;
	return frame | flags | _PAGE_PRESENT;
}

/* inline: on every emulated access, where the page is most often a 4K one */
static __always_inline pteval_t ng_window_entry(const struct ng_page *pg,
						unsigned long addr)
{
	if (unlikely(pg->level != PG_LEVEL_4K))
		return ng_large_entry(pg, addr);
	return pg->saved | _PAGE_PRESENT;
}

/* Make page i of window w show entry, for an access under pcid. */
static __always_inline void ng_window_show(struct ng_window *w, unsigned int i,
					   pteval_t entry, unsigned long pcid)
{
	unsigned int act = ng_window_tlb_use(&w->tlb[i], entry, pcid);

	if (act & NG_WTLB_SET)
		set_pte_atomic(w->ptep[i], __pte(entry));
	if (act & NG_WTLB_FLUSH)
		ng_invlpg(w->va + i * PAGE_SIZE);
}

/*
 * The address of addr (an address in page pg of an armed mapping) in this
 * CPU's window, for width bytes; if they cross into the next 4K page, pg2
 * is the armed page that holds it (pg itself inside a 2M page), and NULL
 * is returned without it.  Interrupts off; valid until this CPU's next
 * call in the same context.
 */
void __iomem *ng_window_map(const struct ng_page *pg, unsigned long addr,
			    const struct ng_page *pg2, unsigned int width)
{
	unsigned long next = (addr & PAGE_MASK) + PAGE_SIZE, pcid;
	unsigned int level = ng_level();
	bool across = addr + width > next;
	struct ng_window *w;

	if (width > PAGE_SIZE || (across && !pg2) || level >= NG_WINDOWS)
		return NULL;
	w = &this_cpu_ptr(ng_windows)[level];
	pcid = ng_cur_pcid();
	ng_window_show(w, 0, ng_window_entry(pg, addr), pcid);
	if (across)
		ng_window_show(w, 1, ng_window_entry(pg2, next), pcid);
	if (unlikely(test_window_hold_us))
		udelay(min(test_window_hold_us, 1000U));
	return (void __iomem *)(w->va + (addr & ~PAGE_MASK));
}

/*
 * Whether [start, start + len) touches the windows' area: never a mapping
 * to arm (an access through a window would fault on the window itself).
 */
bool ng_overlaps_windows(unsigned long start, unsigned long len)
{
	unsigned long first = (unsigned long)ng_window_area;
	unsigned long size = NG_WINDOWS * NG_WINDOW_PAGES * num_possible_cpus() * PAGE_SIZE;

	return start < first + size && first < start + len;
}

/* Every window shows its own page again; process context, none in use. */
void ng_windows_reset(void)
{
	bool changed = false;
	int cpu, i, j;

	for_each_possible_cpu(cpu) {
		struct ng_window *w = per_cpu_ptr(ng_windows, cpu);

		for (i = 0; i < NG_WINDOWS; i++) {
			for (j = 0; j < NG_WINDOW_PAGES; j++) {
				if (w[i].tlb[j].cur == w[i].orig[j])
					continue;
				set_pte_atomic(w[i].ptep[j], __pte(w[i].orig[j]));
				w[i].tlb[j].cur = w[i].orig[j];
				changed = true;
			}
		}
	}
	if (changed)
		ng_flush_all();
}

int ng_windows_init(void)
{
	unsigned int level, n = 0;
	int cpu, i, j;

	ng_window_area = vmalloc(NG_WINDOWS * NG_WINDOW_PAGES * num_possible_cpus() * PAGE_SIZE);
	if (!ng_window_area)
		return -ENOMEM;
	for_each_possible_cpu(cpu) {
		struct ng_window *w = per_cpu_ptr(ng_windows, cpu);

		for (i = 0; i < NG_WINDOWS; i++) {
			w[i].va = (unsigned long)ng_window_area + n * PAGE_SIZE;
			for (j = 0; j < NG_WINDOW_PAGES; j++, n++) {
				w[i].ptep[j] = lookup_address(w[i].va + j * PAGE_SIZE, &level);
				if (!w[i].ptep[j] || level != PG_LEVEL_4K) {
					vfree(ng_window_area);
					return -EFAULT;
				}
				w[i].orig[j] = pte_val(*w[i].ptep[j]);
				w[i].tlb[j].cur = w[i].orig[j];	/* first use: SET */
			}
		}
	}
	return 0;
}

void ng_windows_exit(void)
{
	ng_windows_reset();
	vfree(ng_window_area);
}

/* ---- where an access is made ---------------------------------------- */

/* Whether [phys, phys + width) lies inside the traced range of f. */
bool ng_in_filter(const struct ng_filter *f, phys_addr_t phys, unsigned int width)
{
	return phys >= f->start && phys + width <= f->start + f->size;
}

/*
 * The page of an armed mapping that holds addr, *pg2 the one that holds
 * the last byte if [addr, addr + width) crosses into the next 4K page
 * (else NULL), and *mp their mapping; NULL or NG_UNREACHABLE_PAGE as
 * ng_device_at() says.  No window is changed.
 */
struct ng_page *ng_page_at(struct ng_mapping *hint, unsigned long addr,
			   unsigned int width, struct ng_mapping **mp,
			   struct ng_page **pg2)
{
	unsigned long last = addr + width - 1;
	struct ng_mapping *m = hint;
	struct ng_page *pg;

	*pg2 = NULL;
	if (!m || addr < m->base || addr - m->base >= m->len)
		m = ng_find_mapping(addr);
	if (!m)		/* its last byte may be in one */
		return ((addr ^ last) & PAGE_MASK) && ng_find_mapping(last) ?
		       NG_UNREACHABLE_PAGE : NULL;
	if (last - m->base >= m->len)
		return NG_UNREACHABLE_PAGE;
	pg = ng_find_page(m, addr);
	*pg2 = (addr ^ last) & PAGE_MASK ? ng_find_page(m, last) : NULL;
	if (!pg || (((addr ^ last) & PAGE_MASK) && !*pg2))
		return NG_UNREACHABLE_PAGE;
	*mp = m;
	return pg;
}

/*
 * Where the access [addr, addr + width) is made: this CPU's window onto the
 * page of an armed mapping (above), and *mp is set to the
 * mapping; NULL if no byte of it is in an armed mapping (the other operand
 * of a movs: kernel or user memory); NG_UNREACHABLE if it is in one but
 * the window cannot reach it all (it crosses the mapping's end, or starts
 * outside one): the instruction must be single-stepped.  An access across
 * a page boundary inside a mapping goes through the window's two pages.
 * hint, if not NULL, is looked at before the list of mappings.  The caller
 * asks ng_reported() whether the access is one to report.
 */
void __iomem *ng_device_at(struct ng_mapping *hint, unsigned long addr,
			   unsigned int width, struct ng_mapping **mp)
{
	struct ng_page *pg2, *pg = ng_page_at(hint, addr, width, mp, &pg2);
	void __iomem *io;

	if (!pg)
		return NULL;
	io = IS_ERR(pg) ? NULL : ng_window_map(pg, addr, pg2, width);
	return io ?: NG_UNREACHABLE;
}

/*
 * Where [addr, addr + width) is reached (ng_device_at), under RCU; NULL if not
 * MMIO or not reachable through one window.
 */
void __iomem *ng_device_addr(unsigned long addr, unsigned int width)
{
	struct ng_mapping *m;
	void __iomem *io = ng_device_at(NULL, addr, width, &m);

	return IS_ERR(io) ? NULL : io;
}
