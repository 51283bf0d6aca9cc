// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotrace-ng ksym: one program on the hardware-breakpoint perf events
 * (one per watch and CPU, opened by mmiotrace_ng/ksym/probes.py).  It runs
 * in the debug exception, after the access: it finds the watch by the
 * breakpoint's address, then either counts the hit per (watch, place) in
 * "hist" or writes a record into the ring buffer "hits".  A record that
 * finds no room is counted in "drops" and reported with the CPU's next.
 */
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include <linux/types.h>

#include "ksym.h"

/* one page here; the loader creates it with the size asked for */
BPF_RINGBUF_OUTPUT(hits, 1);
BPF_HASH(watches, u64, struct ng_ksym_watch, NG_KSYM_MAX_WATCHES);
BPF_ARRAY(config, u32, NG_KSYM_CONFIG_SLOTS);
/* [0]: records dropped in all; [1]: dropped since this CPU's last record */
BPF_PERCPU_ARRAY(drops, u64, 2);
BPF_HASH(hist, struct ng_ksym_key, u64, NG_KSYM_HIST_ENTRIES);
/* [0]: hits not counted because "hist" was full */
BPF_ARRAY(hist_full, u64, 1);

/* A record that could not be made: counted, and reported with the next. */
static __always_inline void ng_count_drop(void)
{
	int total = 0, pending = 1;
	u64 *t = drops.lookup(&total), *p = drops.lookup(&pending);

	if (t)
		(*t)++;
	if (p)
		(*p)++;
}

/* The watched bytes (8 read at once unless that crosses into a hole). */
static __always_inline u64 ng_value(u64 addr, u32 len)
{
	u64 v = 0;

	if (!bpf_probe_read_kernel(&v, sizeof(v), (void *)addr))
		return v;
	if (len == 4)
		bpf_probe_read_kernel(&v, 4, (void *)addr);
	else if (len == 2)
		bpf_probe_read_kernel(&v, 2, (void *)addr);
	else if (len == 1)
		bpf_probe_read_kernel(&v, 1, (void *)addr);
	return v;
}

int on_hit(struct bpf_perf_event_data *ctx)
{
	u64 addr = ctx->addr;
	struct ng_ksym_watch *w = watches.lookup(&addr);
	struct ng_ksym_hit *r;
	int zero = 0, one = 1;
	u32 *histogram;
	u64 *pending;

	if (!w)
		return 0;
	histogram = config.lookup(&zero);
	if (histogram && *histogram) {
		struct ng_ksym_key k = { .ip = PT_REGS_IP(&ctx->regs), .slot = w->slot };
		u64 init = 0, *count = hist.lookup_or_try_init(&k, &init);

		u64 *full;

		if (count) {
			__sync_fetch_and_add(count, 1);
		} else {
			full = hist_full.lookup(&zero);
			if (full)
				__sync_fetch_and_add(full, 1);
		}
		return 0;
	}
	r = hits.ringbuf_reserve(sizeof(*r));
	if (!r) {
		ng_count_drop();
		return 0;
	}
	pending = drops.lookup(&one);
	r->lost = 0;
	if (pending) {
		r->lost = *pending;
		*pending = 0;
	}
	r->ts_ns = bpf_ktime_get_ns();
	r->ip = PT_REGS_IP(&ctx->regs);
	r->value = ng_value(addr, w->len);
	r->pid = bpf_get_current_pid_tgid();
	r->cpu = bpf_get_smp_processor_id();
	r->slot = w->slot;
	r->pad = 0;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	hits.ringbuf_submit(r, 0);
	return 0;
}
