/* SPDX-License-Identifier: GPL-2.0 */
/*
 * When a window's TLB entry must be dropped before an access through it.
 * Kept free of kernel headers: tests/unit/window_tlb_model.c runs it
 * against a model of a TLB tagged by PCID.
 *
 * A window's page-table entry is kernel memory.  Without PTI it is global,
 * and invlpg drops a global entry whatever the PCID.  With PTI (and PCID)
 * kernel entries are not global: each address space's kernel PCID caches
 * its own translation of the window, and invlpg drops only the current
 * PCID's.  So after CPU n showed page X under PCID A and then page Y under
 * PCID B, back under A the TLB may still translate the window to X even
 * though the entry says Y: for a small BAR, X may be another device.
 *
 * The rule kept here: for the PCID the window was last used under, the TLB
 * holds no translation of the window other than the entry's (it was
 * flushed there after the entry last changed, or when the CPU came to that
 * PCID).  Under any other PCID nothing is known, so the window's entry is
 * dropped before use, and that PCID becomes the one remembered.  The cost:
 * one invlpg when the first access after a switch of address space goes
 * through the same window page.  (The kernel's flush_tlb_one_kernel()
 * instead marks every other PCID for a flush at its next use, with state
 * a module cannot reach.)
 *
 * Context: the window's CPU, interrupts off (or NMI, with a window of its
 * own); no lock.
 */
#ifndef NG_WINDOW_TLB_H
#define NG_WINDOW_TLB_H

struct ng_window_tlb {
	unsigned long long cur;		/* the entry the window has now */
	unsigned long pcid;		/* the PCID its TLB entry is known in */
};

#define NG_WTLB_SET	1U	/* write the new entry, then drop the TLB entry */
#define NG_WTLB_FLUSH	2U	/* drop the TLB entry */

/* What to do before an access through the window showing entry, now. */
static inline unsigned int ng_window_tlb_use(struct ng_window_tlb *t,
					     unsigned long long entry,
					     unsigned long pcid)
{
	unsigned int act = 0;

	if (t->cur != entry) {
		t->cur = entry;
		act = NG_WTLB_SET | NG_WTLB_FLUSH;
	} else if (t->pcid != pcid) {
		act = NG_WTLB_FLUSH;
	}
	t->pcid = pcid;
	return act;
}

#endif /* NG_WINDOW_TLB_H */
