// SPDX-License-Identifier: GPL-2.0
/*
 * A model of one CPU's TLB for one window page, tagged by PCID, run
 * against kmod/ng_window_tlb.h (tests/unit/test_window_tlb.py): random
 * accesses under random PCIDs to random pages, with the TLB filling itself
 * (also speculatively) and dropping entries at will, as hardware may.
 * Every access must translate to the page the window's entry shows.
 *
 * -DNG_RULE_ENTRY_ONLY models the earlier rule (drop the TLB entry only
 * when the window's entry changes), which the model must catch.
 *
 * Output: "ok <accesses>" (exit 0) or "stale <access> <pcid> <want> <got>"
 * (exit 1).
 */
#include <stdio.h>
#include <stdlib.h>

#include "ng_window_tlb.h"

#define NPCID	6	/* the kernel's dynamic ASIDs per CPU */
#define NPAGE	3

struct tlb_slot {
	int valid;
	unsigned long long val;
};

static unsigned long long pte;	/* the window's page-table entry */
static struct tlb_slot tlb[NPCID];

static unsigned int rule(struct ng_window_tlb *t, unsigned long long entry,
			 unsigned long pcid)
{
#ifdef NG_RULE_ENTRY_ONLY
	if (t->cur != entry) {
		t->cur = entry;
		return NG_WTLB_SET | NG_WTLB_FLUSH;
	}
	(void)pcid;
	return 0;
#else
	return ng_window_tlb_use(t, entry, pcid);
#endif
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 200000;
	struct ng_window_tlb t = { .cur = 0, .pcid = 0 };
	long i;

	srand(argc > 2 ? atoi(argv[2]) : 1);
	pte = 0;
	for (i = 0; i < n; i++) {
		unsigned long pcid = rand() % NPCID;
		unsigned long long entry = 1 + rand() % NPAGE;
		unsigned int act;
		int p;

		/* hardware: a speculative walk, or an entry dropped */
		for (p = 0; p < NPCID; p++) {
			if (p == (int)pcid && !(rand() % 4) && !tlb[p].valid)
				tlb[p] = (struct tlb_slot){ 1, pte };
			if (!(rand() % 50))
				tlb[p].valid = 0;
		}
		act = rule(&t, entry, pcid);
		if (act & NG_WTLB_SET)
			pte = entry;
		if (act & NG_WTLB_FLUSH)
			tlb[pcid].valid = 0;	/* invlpg: this PCID only */
		if (!tlb[pcid].valid)
			tlb[pcid] = (struct tlb_slot){ 1, pte };
		if (tlb[pcid].val != entry) {
			printf("stale %ld %lu %llu %llu\n", i, pcid, entry, tlb[pcid].val);
			return 1;
		}
	}
	printf("ok %ld\n", n);
	return 0;
}
