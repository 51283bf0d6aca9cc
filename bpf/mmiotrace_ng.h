/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Records the BPF programs put into the ring buffer for the loader, and
 * the settings the loader gives them.
 * The only definition: bpf/mmiotrace_ng.bpf.c includes it, and
 * mmiotrace_ng/format/records.py mirrors it (tests/unit/test_abi.py compiles this
 * header on the host and checks every size and offset of the mirror).
 */
#ifndef MMIOTRACE_NG_H
#define MMIOTRACE_NG_H

#include "mmiotng_abi.h"

/* marker text kept: what the kernel keeps (1 KiB on 6.1, 4 KiB on 6.12) */
#define NG_MARK_MAX	MMIOTNG_MARK_MAX
#define NG_INSN_BYTES	MMIOTNG_INSN_BYTES

enum ng_rec_type {
	NG_REC_MAP = 1,
	NG_REC_UNMAP = 2,
	NG_REC_ACCESS = 3,
	NG_REC_MARK = 4,
	NG_REC_UNTRACED = 5,
	NG_REC_IRQ = 6,
	NG_REC_DMA = 7,
};

/* a device's name (its PCI address, "0000:00:05.0") or a handler's, NUL-padded */
#define NG_NAME_LEN	16

/*
 * Settings, written by the loader into the BPF map "config" (u32 values at
 * these indexes) before anything is armed: the compiled programs serve
 * every device and buffer size.  What is traced is not among them: the
 * helper decides, and reports each mapping it arms (mmiotng_map).
 */
/* access records wake the reader at most this often per CPU (ns) */
#define NG_WAKE_NS	1000000

enum ng_config {
	NG_CONFIG_TRACER = 0,		/* the tracer's process id */
	NG_CONFIG_ALL = 1,		/* 1: MAP every other mapping too, as with --all */
	NG_CONFIG_HISTOGRAM = 2,	/* 1: count accesses in "hist", no access record */
	NG_CONFIG_SLOTS = 3,
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

/* MAP: an ioremap the helper armed (or, with --all, any other) */
struct ng_rec_map {
	struct ng_rec_hdr hdr;
	__u64 phys;		/* as passed to ioremap (unaligned) */
	__u64 virt;		/* as returned */
	__u64 len;		/* as passed */
	__u64 ip;		/* caller of ioremap */
	__s32 map_id;
	__u32 pid;
};

/*
 * user_map_ids' key: a process's mapping by its address space (its
 * mm_struct; the process's tgid on a kernel whose BTF does not say where a
 * task keeps it) and its user address there
 */
struct ng_user_map_key {
	__u64 virt;
	__u64 mm;
};

/* user_map_ids' value: the map id, and the process its MAP named */
struct ng_user_map_val {
	__s32 map_id;
	__u32 tgid;
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

/* A mapping of a traced range that the helper did not arm: NOT traced */
struct ng_rec_untraced {
	struct ng_rec_hdr hdr;
	__u64 phys;		/* as passed to ioremap */
	__u64 virt;
	__u64 len;
	__s32 err;		/* why: -errno (mmiotrace_ng/format/render.py says it in words) */
	__u32 pid;
};

/*
 * IRQ: the hard interrupt handler of a traced device's interrupt line or
 * MSI vector ran: its entry, then its exit with the result.
 */
struct ng_rec_irq {
	struct ng_rec_hdr hdr;
	__u32 irq;		/* the Linux interrupt number */
	__u32 pid;		/* the task it interrupted */
	__u8 exit;		/* 0: the handler's entry, 1: its exit */
	__u8 ret;		/* exit: irqreturn_t (IRQ_HANDLED 1, IRQ_WAKE_THREAD 2) */
	__u8 pad[6];
	char dev[NG_NAME_LEN];		/* the traced device the line is of */
	char handler[NG_NAME_LEN];	/* the name the handler was requested with */
};

/* what a DMA record is of: the kernel's dma tracepoint it came from */
enum ng_dma_kind {
	NG_DMA_MAP = 0,		/* dma_map_page, dma_map_resource (a streaming mapping) */
	NG_DMA_UNMAP = 1,	/* dma_unmap_page, dma_unmap_resource */
	NG_DMA_ALLOC = 2,	/* dma_alloc, dma_alloc_pages (a coherent buffer) */
	NG_DMA_FREE = 3,	/* dma_free, dma_free_pages */
	NG_DMA_MAP_SG = 4,	/* dma_map_sg: one record per mapped entry */
	NG_DMA_UNMAP_SG = 5,	/* dma_unmap_sg: one record per entry */
};

/*
 * DMA: a traced device's DMA mapping made or undone (the kernel's dma
 * tracepoints, Linux 6.12 and later).
 */
struct ng_rec_dma {
	struct ng_rec_hdr hdr;
	__u64 addr;		/* the bus (DMA) address the device uses */
	__u64 size;		/* bytes */
	__u64 phys;		/* the CPU's physical address (MAP), virtual (ALLOC, FREE), or 0 */
	__u32 pid;
	__u8 kind;		/* enum ng_dma_kind */
	__u8 dir;		/* enum dma_data_direction: 0 both, 1 to device, 2 from it */
	__u8 pad[2];
	char dev[NG_NAME_LEN];	/* the traced device */
};

/*
 * ng_rec_untraced.err of a traced range mapped into a process (by a driver's
 * remap_pfn_range(): a sysfs resourceN file's mmap, a driver's own
 * mmap): -EREMOTE, the mapping is in another address space; virt is its
 * user address, pid the process.  Accesses from user space are not traced.
 */
#define NG_ERR_USER_MAP	66

/* the traced physical ranges (the map "user_ranges"), at most */
#define NG_USER_RANGES	256

/* a traced physical range: the map "user_ranges" (size 0: none) */
struct ng_phys_range {
	__u64 start;
	__u64 size;
};

/* the devices whose interrupts and DMA are traced, and their interrupts, at most */
#define NG_TRACED_DEVS	1024
#define NG_IRQ_LINES	4096

/* a device's name: the key of the map "traced_devs", the value of "irq_lines" */
struct ng_dev_name {
	char name[NG_NAME_LEN];
};

/* --histogram: the key of the map "hist", one per register and place */
struct ng_hist_key {
	__u64 phys;		/* physical address accessed */
	__u64 ip;		/* address of the instruction */
	__u8 op;		/* MMIOTNG_OP_* */
	__u8 width;
	__u8 pad[6];
};

struct ng_hist_val {
	__u64 count;
	__u64 last;		/* the value of the latest access */
	__u64 last_ns;		/* and its time (bpf_ktime_get_ns) */
};

#define NG_HIST_ENTRIES	65536

#endif /* MMIOTRACE_NG_H */
