/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The hardware-breakpoint tracer (mmiotrace-ng ksym): what bpf/ksym.bpf.c
 * records and the maps the loader fills.  The only definition:
 * mmiotrace_ng/ksym/records.py mirrors it (tests/unit/test_abi.py compiles
 * this header on the host and checks every size and offset of the mirror).
 */
#ifndef MMIOTRACE_NG_KSYM_H
#define MMIOTRACE_NG_KSYM_H

#define NG_KSYM_MAX_WATCHES	4	/* the x86 debug registers */
#define NG_KSYM_COMM_LEN	16	/* TASK_COMM_LEN */
#define NG_KSYM_HIST_ENTRIES	16384	/* (watch, place) pairs counted */

/* slots of the map "config" (u32 values), set before any watch is armed */
enum ng_ksym_config {
	NG_KSYM_CONFIG_HISTOGRAM = 0,	/* 1: count in "hist", emit no record */
	NG_KSYM_CONFIG_SLOTS = 1,
};

/* the value of the map "watches", keyed by the breakpoint's address */
struct ng_ksym_watch {
	__u32 slot;		/* the request's index, 0 .. NG_KSYM_MAX_WATCHES - 1 */
	__u32 len;		/* bytes watched: 1, 2, 4 or 8 */
};

/* one hit of a watch, in the ring buffer "hits" */
struct ng_ksym_hit {
	__u64 ts_ns;		/* bpf_ktime_get_ns() */
	__u64 ip;		/* where the CPU was after the access */
	__u64 value;		/* the watched bytes after the access (len of them) */
	__u32 lost;		/* hits this CPU dropped since its last record */
	__u32 pid;
	__u16 cpu;
	__u16 slot;		/* ng_ksym_watch.slot */
	__u32 pad;
	char comm[NG_KSYM_COMM_LEN];
};

/* the key of the map "hist" (value: a u64 count) */
struct ng_ksym_key {
	__u64 ip;
	__u32 slot;
	__u32 pad;
};

#endif /* MMIOTRACE_NG_KSYM_H */
