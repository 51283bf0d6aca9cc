/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The helper module's interface, shared by the module, the BPF programs and
 * the Python loader (mmiotrace_ng/format/abi.py mirrors it; tests/unit/test_abi.py
 * checks the mirror against this file).
 *
 * 1. The tracepoints.  For every traced access the module fires the
 *    tracepoint MMIOTNG_ACCESS_TP with one argument, a
 *    const struct mmiotng_access *; the BPF side attaches a raw tracepoint
 *    program there and copies *a.  Writes to trace_marker fire
 *    MMIOTNG_MARK_TP(const char *text, __u32 len) the same way.  Every
 *    mapping of a traced range fires MMIOTNG_MAP_TP(const struct
 *    mmiotng_map *m) when the module arms it (err 0: its MAP record) or
 *    leaves it unarmed (err < 0, why: it is NOT traced); the module is the
 *    one authority on what is traced.
 * 2. The generic-netlink family MMIOTNG_GENL_NAME: commands and attributes.
 * 3. The flight region (MMIOTNG_CMD_FLIGHT_START): the layout of the
 *    reserved memory where the module keeps the last accesses of each CPU
 *    for after a crash and a warm reboot (struct mmiotng_flight_hdr).
 *    MMIOTNG_ABI_VERSION changes whenever either part does in a way the
 *    other side must know (MMIOTNG_MODE_TRAP_ONLY came without a change:
 *    the tracer never sends it); STATUS reports the version of the loaded
 *    module.
 */
#ifndef MMIOTNG_ABI_H
#define MMIOTNG_ABI_H

#include <linux/types.h>

#ifndef MMIOTNG_ABI_VERSION	/* a test builds a stale helper with another */
#define MMIOTNG_ABI_VERSION	10
#endif
#define MMIOTNG_ACCESS_TP	"mmiotng_access"
/*
 * mmiotng_mark(const char *text, __u32 len): a trace_marker write; text
 * points to MMIOTNG_MARK_MAX readable bytes, len <= MMIOTNG_MARK_MAX
 */
#define MMIOTNG_MARK_TP		"mmiotng_mark"
#define MMIOTNG_MAP_TP		"mmiotng_map"
#define MMIOTNG_MARK_MAX	4096	/* the most a trace_marker write keeps (6.12: 4 KiB) */
#define MMIOTNG_INSN_BYTES	8
#define MMIOTNG_MAX_FILTERS	256	/* traced ranges (BARs, ROMs) at a time */

/* enum mmiotng_op: what an access did */
#define MMIOTNG_OP_READ		0
#define MMIOTNG_OP_WRITE	1
#define MMIOTNG_OP_UNKNOWN	2

/* mmiotng_access.flags */
#define MMIOTNG_F_SINGLESTEP	0x01	/* taken by single-stepping */
#define MMIOTNG_F_REP		0x02	/* one element of a string instruction */
/*
 * From user mode, through a process's mapping: map_virt is the VMA's
 * start there, map_phys and map_len what it maps, ip the user PC
 */
#define MMIOTNG_F_USER		0x04

/*
 * mmiotng_map.err of a page of a process's mapping (virt, phys, size: the
 * page; pid: the process) that is no longer traced: an access to it from
 * kernel mode (a read() from it) or from a 32-bit task; an instruction the
 * helper does not emulate there
 */
#define MMIOTNG_ERR_USER_KERNEL	67
#define MMIOTNG_ERR_USER_INSN	68

struct mmiotng_access {
	__u64 map_virt;		/* address ioremap returned for the mapping */
	__u64 phys;		/* physical address accessed */
	__u64 value;		/* value read or written (width bytes) */
	__u64 compat_value;	/* the value the kernel's mmiotrace reports */
	__u64 ip;		/* address of the instruction */
	__u8 width;		/* bytes: 1, 2, 4, 8; 0 when op is UNKNOWN */
	__u8 op;		/* MMIOTNG_OP_* */
	__u8 compat_width;	/* the width the kernel's mmiotrace reports */
	__u8 compat_op;		/* MMIOTNG_OP_* as the kernel's mmiotrace sees it */
	__u8 insn_len;		/* valid bytes in insn[] */
	__u8 flags;		/* MMIOTNG_F_* */
	/* accesses of this CPU the helper could not report before this one */
	__u16 lost;
	__u8 insn[MMIOTNG_INSN_BYTES];	/* first bytes of the instruction */
	__u64 ts_ns;		/* when it happened (ktime_get_mono_fast_ns), 0: now */
	__u64 map_phys;		/* MMIOTNG_F_USER: the physical address map_virt maps */
	__u64 map_len;		/* MMIOTNG_F_USER: the bytes the mapping has */
};

/* The argument of MMIOTNG_MAP_TP. */
struct mmiotng_map {
	__u64 virt;		/* address ioremap returned */
	__u64 phys;		/* as passed to ioremap */
	__u64 size;		/* as passed to ioremap */
	/*
	 * 0: armed, traced; else -errno: not traced.  virt 0, err < 0: a BAR
	 * of a device bound while tracing that got no filter (NEW_DEVICES), or
	 * a traced range (-ENODEV: its device was removed).  -EXDEV: a traced
	 * BAR moved away from phys/size; virt its new start, which is traced
	 * (0: not, said by the next record of the new range).
	 */
	__s32 err;
	__u32 pid;		/* the process of a user mapping's page, 0: the current task */
};

/* Generic netlink */
#define MMIOTNG_GENL_NAME	"mmiotrace_ng"
#define MMIOTNG_GENL_VERSION	1

enum mmiotng_cmd {
	MMIOTNG_CMD_UNSPEC,
	MMIOTNG_CMD_FILTER_ADD,		/* PHYS, SIZE: trace mappings of this range */
	MMIOTNG_CMD_FILTER_DEL,		/* PHYS, SIZE */
	MMIOTNG_CMD_ARM_EXISTING,	/* VIRT, SIZE, PHYS: arm a live mapping */
	MMIOTNG_CMD_DISARM_ALL,		/* drop all filters, restore all pages */
	MMIOTNG_CMD_STATUS,		/* reply: the STAT_* attributes */
	MMIOTNG_CMD_SET_MODE,		/* MODE: MMIOTNG_MODE_* */
	MMIOTNG_CMD_NEW_DEVICES,	/* trace each PCI device a driver binds to from now on */
	/* PHYS, SIZE, RECS, TEXT: keep the last RECS accesses per CPU in that reserved memory */
	MMIOTNG_CMD_FLIGHT_START,
	/* PHYS, SIZE, OFFSET: reply FLIGHT_DATA, the region's bytes from OFFSET */
	MMIOTNG_CMD_FLIGHT_READ,
	/* CPU, SYNC_NS: its records stamped up to then are written (the first: --sync on) */
	MMIOTNG_CMD_SYNC,
	/*
	 * USER_PIDS, USER_COMMS (optional): arm the traced pages processes
	 * map from now on (remap_pfn_range), of those processes only if given
	 */
	MMIOTNG_CMD_TRACE_USER,
	/* PID, VIRT, SIZE: arm that process's mapping (made before TRACE_USER) */
	MMIOTNG_CMD_ARM_USER,
	__MMIOTNG_CMD_MAX,
};

#define MMIOTNG_CMD_MAX (__MMIOTNG_CMD_MAX - 1)

/*
 * MMIOTNG_ATTRS(X): the one list of attributes, in number order from 1.
 * X(NAME, TYPE, DIR) gives MMIOTNG_A_NAME, its payload (U32 or U64: NLA_
 * and nla_get_/nla_put_ suffixes; STRING, a NUL-terminated string; BINARY,
 * bytes) and its direction: REQ, taken in a request; REPLY, only in
 * replies (a request carrying it is refused).  The enum, the module's
 * policy and the check of the Python mirror (ATTR_TYPES in
 * mmiotrace_ng/format/abi.py) all come from this list.
 */
#define MMIOTNG_ATTRS(X)						\
	X(PHYS, U64, REQ)		/* physical address */		\
	X(SIZE, U64, REQ)		/* bytes */			\
	X(VIRT, U64, REQ)		/* address ioremap returned */	\
	X(MODE, U32, REQ)		/* MMIOTNG_MODE_* */		\
	X(STAT_ARMED_PAGES, U64, REPLY)					\
	X(STAT_MAPPINGS, U64, REPLY)					\
	X(STAT_FILTERS, U64, REPLY)					\
	X(STAT_FAULTS, U64, REPLY)					\
	X(STAT_EMULATED, U64, REPLY)					\
	X(STAT_SINGLESTEPPED, U64, REPLY)				\
	X(STAT_UNKNOWN, U64, REPLY)					\
	X(STAT_OWNER, U32, REPLY)	/* port id of the controller, 0: none */ \
	X(STAT_REFUSED, U64, REPLY)	/* mappings of a traced range left unarmed */ \
	X(STAT_RETRIED, U64, REPLY)	/* faults that raced a disarm, retried */ \
	X(STAT_ABI_VERSION, U32, REPLY)	/* MMIOTNG_ABI_VERSION of the module */ \
	X(STAT_STALE, U64, REPLY)	/* armed entries unmapped unseen, left alone */ \
	X(STAT_PROBES_OFF, U32, REPLY)	/* 1: kprobes are disabled, nothing traced */ \
	X(STAT_MISSED, U64, REPLY)	/* ioremap/iounmap calls the probes missed */ \
	X(STAT_SPARE_BYTES, U64, REPLY)	/* bytes the spare mappings take */ \
	X(RECS, U32, REQ)		/* flight records per CPU */	\
	X(OFFSET, U64, REQ)		/* bytes into the flight region */ \
	X(TEXT, STRING, REQ)		/* the trace's header, for recover */ \
	X(FLIGHT_DATA, BINARY, REPLY)	/* FLIGHT_READ's bytes */	\
	X(STAT_FLIGHT_RECS, U64, REPLY)	/* flight records kept per CPU, 0: off */ \
	X(SYNC_NS, U64, REQ)		/* --sync: written up to this stamp */ \
	X(CPU, U32, REQ)		/* --sync: of this CPU's records */ \
	X(STAT_SYNC_LATE, U64, REPLY)	/* --sync: waits that timed out */ \
	X(PID, U32, REQ)		/* ARM_USER: the process */	\
	X(USER_PIDS, BINARY, REQ)	/* TRACE_USER: __u32 process ids */ \
	X(USER_COMMS, BINARY, REQ)	/* TRACE_USER: names, MMIOTNG_COMM_LEN each */

#define MMIOTNG_ATTR_ENUM(n, t, dir)	MMIOTNG_A_##n,

enum mmiotng_attr {
	MMIOTNG_A_UNSPEC,
	MMIOTNG_ATTRS(MMIOTNG_ATTR_ENUM)
	MMIOTNG_A_PAD,			/* padding of 64-bit attributes */
	__MMIOTNG_A_MAX,
};

#define MMIOTNG_A_MAX (__MMIOTNG_A_MAX - 1)

/*
 * TRACE_USER's process filter: at most this many ids and names (a name is
 * NUL-padded to MMIOTNG_COMM_LEN bytes, the kernel's TASK_COMM_LEN; it
 * matches a thread's name or its process's).
 */
#define MMIOTNG_USER_MAX_PIDS	16
#define MMIOTNG_USER_MAX_COMMS	8
#define MMIOTNG_COMM_LEN	16

/* MMIOTNG_A_MODE values */
#define MMIOTNG_MODE_EMULATE	0	/* decode and emulate; single-step the rest */
#define MMIOTNG_MODE_SINGLESTEP	1	/* single-step every access (benchmarks) */
/*
 * Benchmarks only, refused (EPERM) unless the module was loaded with
 * test_modes=1: take the fault and skip the instruction, making no access
 * and reporting nothing (the floor of the cost of a trap); instructions the
 * decoder does not know are still single-stepped and reported.
 */
#define MMIOTNG_MODE_TRAP_ONLY	2

/*
 * The flight region: reserved memory (memmap=SIZE$ADDR: e820 "Reserved",
 * never RAM) that survives a warm reboot.  FLIGHT_START writes a header,
 * a table of the mappings and a ring of records per possible CPU:
 *
 *   [struct mmiotng_flight_hdr][maps x struct mmiotng_flight_map]
 *   [cpus x recs x struct mmiotng_flight_rec]
 *
 * at offsets maps_off and recs_off.  A record's seq is the CPU's record
 * number plus one, written last (0 while it is written): a record with
 * seq 0, or one its slot does not hold ((seq - 1) % recs), is not one.
 * The map table is filled the same way from one counter of all CPUs.
 */
#define MMIOTNG_FLIGHT_MAGIC	"MMIOTNGF"
#define MMIOTNG_FLIGHT_VERSION	1
#define MMIOTNG_FLIGHT_MAPS	256
#define MMIOTNG_FLIGHT_MSG	256	/* the crash's words */
#define MMIOTNG_FLIGHT_TEXT	4096	/* the trace's header text */
#define MMIOTNG_FLIGHT_READ_MAX	16384	/* bytes in one FLIGHT_READ reply */
/*
 * Records per CPU at least: contexts nested on one CPU each write a few
 * while the one below holds its slot, which the ring must not come round to.
 */
#define MMIOTNG_FLIGHT_MIN_RECS	16

/* mmiotng_flight_hdr.state */
#define MMIOTNG_FLIGHT_RECORDING	1
#define MMIOTNG_FLIGHT_STOPPED		2	/* the session ended */
#define MMIOTNG_FLIGHT_CRASHED		3	/* the machine died while recording */

/* mmiotng_flight_hdr.reason */
#define MMIOTNG_FLIGHT_PANIC	1	/* panic(): message holds its words */
#define MMIOTNG_FLIGHT_OOPS	2	/* an oops (die()): its words and where */

struct mmiotng_flight_hdr {
	__u8 magic[8];		/* MMIOTNG_FLIGHT_MAGIC, no NUL */
	__u32 version;		/* MMIOTNG_FLIGHT_VERSION */
	__u32 state;		/* MMIOTNG_FLIGHT_* */
	__u32 cpus;		/* rings: one per possible CPU number */
	__u32 recs;		/* records per ring */
	__u32 rec_bytes;	/* sizeof(struct mmiotng_flight_rec) */
	__u32 maps;		/* entries of the map table */
	__u64 maps_off;		/* bytes from the start: the map table */
	__u64 recs_off;		/* the rings */
	__u64 start_ns;		/* the session's start, ktime_get_mono_fast_ns */
	__u64 start_real_ns;	/* and the wall clock then */
	__u64 crash_ns;		/* the first crash's time (mono) */
	__u32 reason;		/* MMIOTNG_FLIGHT_PANIC or _OOPS */
	__s32 crash_cpu;	/* where it happened */
	__u32 panicked;		/* 1: panic() came (after the oops, if any) */
	__u32 pad;
	char message[MMIOTNG_FLIGHT_MSG];	/* NUL-terminated */
	char text[MMIOTNG_FLIGHT_TEXT];		/* NUL-terminated */
};

struct mmiotng_flight_map {
	__u64 seq;		/* as a record's, from one counter */
	__u64 virt;
	__u64 phys;
	__u64 size;
};

struct mmiotng_flight_rec {
	__u64 seq;		/* the CPU's record number + 1; 0: none */
	__u64 ts_ns;		/* ktime_get_mono_fast_ns */
	__u64 map_virt;		/* the mapping's address (mmiotng_access) */
	__u64 phys;
	__u64 value;
	__u64 ip;
	__u8 width;
	__u8 op;		/* MMIOTNG_OP_* */
	__u8 flags;		/* MMIOTNG_F_* */
	__u8 pad[5];
};

#endif /* MMIOTNG_ABI_H */
