/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Records the BPF programs put into the ring buffer for the loader, and
 * the settings the loader gives them.
 * The only definition: bpf/mmiotrace_ng.bpf.c includes it, and
 * mmiotrace_ng/records.py mirrors it (tests/unit/test_abi.py compiles this
 * header on the host and checks every size and offset of the mirror).
 */
#ifndef MMIOTRACE_NG_H
#define MMIOTRACE_NG_H

#define NG_MARK_MAX	1024	/* bytes of marker text kept (the kernel keeps 1 KiB) */
#define NG_INSN_BYTES	8
#define NG_MAX_RANGES	64	/* traced physical ranges: 7 resources per device */

enum ng_rec_type {
	NG_REC_MAP = 1,
	NG_REC_UNMAP = 2,
	NG_REC_ACCESS = 3,
	NG_REC_MARK = 4,
};

/*
 * What to trace, written by the loader into two BPF maps before anything is
 * armed (the compiled programs serve every device and buffer size):
 * "config", u32 values at these indexes, and "ranges", NG_MAX_RANGES
 * struct ng_range of which the first NG_CONFIG_NR_RANGES are used.
 */
enum ng_config {
	NG_CONFIG_TRACER = 0,		/* the tracer's process id */
	NG_CONFIG_ALL = 1,		/* 1: every mapping, as with --all */
	NG_CONFIG_NR_RANGES = 2,
	NG_CONFIG_SLOTS = 3,
};

/* A physical range whose mappings are traced. */
struct ng_range {
	__u64 start;
	__u64 end;		/* exclusive */
};

/* Common to all records. */
struct ng_rec_hdr {
	__u64 ts_ns;		/* bpf_ktime_get_ns() */
	__u32 lost;		/* records this CPU dropped since its last record */
	__u16 type;		/* enum ng_rec_type */
	__u16 cpu;
};

/* R, W, UNKNOWN: one traced access (see kmod/mmiotng_abi.h) */
struct ng_rec_access {
	struct ng_rec_hdr hdr;
	__u64 phys;
	__u64 value;
	__u64 compat_value;
	__u64 ip;
	__s32 map_id;
	__u32 pid;
	__u8 width;
	__u8 op;
	__u8 compat_width;
	__u8 compat_op;
	__u8 insn_len;
	__u8 flags;
	__u8 pad[2];
	__u8 insn[NG_INSN_BYTES];
};

/* MAP: an ioremap of a traced range */
struct ng_rec_map {
	struct ng_rec_hdr hdr;
	__u64 phys;		/* as passed to ioremap (unaligned) */
	__u64 virt;		/* as returned */
	__u64 len;		/* as passed */
	__u64 ip;		/* caller of ioremap */
	__s32 map_id;
	__u32 pid;
};

/* UNMAP: iounmap of a traced mapping (map_id -1 when unknown) */
struct ng_rec_unmap {
	struct ng_rec_hdr hdr;
	__u64 virt;
	__u64 ip;
	__s32 map_id;
	__u32 pid;
};

/* MARK: a write to trace_marker */
struct ng_rec_mark {
	struct ng_rec_hdr hdr;
	__u32 len;		/* bytes of text, <= NG_MARK_MAX */
	__u32 pid;
	char text[NG_MARK_MAX];
};

#endif /* MMIOTRACE_NG_H */
