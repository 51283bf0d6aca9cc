/* SPDX-License-Identifier: GPL-2.0 */
/* Internal declarations of the mmiotng module (see mmiotng_main.c). */
#ifndef MMIOTNG_H
#define MMIOTNG_H

#include <linux/types.h>
#include <linux/bits.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/rcupdate.h>
#include <linux/percpu.h>
#include <asm/pgtable_types.h>

#include "mmiotng_abi.h"

#define NG_MAX_FILTERS		16
#define NG_MAX_FILTER_SIZE	BIT_ULL(32)	/* 4 GiB: larger BARs are refused */

/* A physical range to trace (a BAR), with its never-armed shadow mapping. */
struct ng_filter {
	struct list_head node;
	phys_addr_t start;
	u64 size;
	void __iomem *shadow;
};

/* One page-table entry of an armed mapping: a 4K page or a 2M page. */
struct ng_page {
	pte_t *ptep;
	unsigned long addr;
	pteval_t saved;		/* the entry before arming */
	unsigned int level;	/* PG_LEVEL_4K or PG_LEVEL_2M */
	unsigned int steppers;	/* CPUs single-stepping on it (ng_lock) */
	bool armed;
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
	unsigned int npages;
	struct ng_page pages[];
};

struct ng_stats {
	u64 armed_pages;
	u64 mappings;
	u64 filters;
	u64 faults;
	u64 emulated;
	u64 singlestepped;
	u64 unknown;
	u64 refused;
	u64 retried;
};

extern struct mutex ng_mutex;

void mmiotng_access_hook(const struct mmiotng_access *a);

int ng_filter_add(phys_addr_t start, u64 size);
int ng_filter_del(phys_addr_t start, u64 size);
int ng_arm_existing(unsigned long virt, u64 size, phys_addr_t phys);
void ng_disarm_all(void);
int ng_set_mode(u32 mode);
unsigned int ng_nr_filters(void);
void ng_wait_steps(void);
void ng_get_stats(struct ng_stats *sum);
bool ng_kernel_mmiotrace_active(void);
bool ng_session_active(void);
void mmiotng_mark_hook(const char *text, u32 len);
int ng_hooks_init(void);
void ng_hooks_exit(void);

int ng_nl_init(void);
void ng_nl_exit(void);

#endif /* MMIOTNG_H */
