// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotrace-ng BPF programs (compiled by bcc at start-up).
 *
 * - the helper's tracepoint mmiotng_map -> MAP for each mapping it arms
 *   (map ids counted from 1), or a NOT-traced record for one it did not;
 * - with NG_CONFIG_ALL (--all) only, ioremap family entry/return -> MAP for
 *   every other mapping (the helper's MAP of an armed one came first: its
 *   __ioremap_caller returned before the outer ioremap function);
 * - iounmap entry -> UNMAP of a mapping that has a map id;
 * - the helper's tracepoint mmiotng_access (raw tracepoint) -> one access
 *   record (R/W/UNKNOWN);
 * - the helper's tracepoint mmiotng_mark (trace_marker writes) -> MARK;
 * - irq_handler_entry/exit (raw tracepoints) of an interrupt in irq_lines
 *   (the traced devices' lines and vectors) -> IRQ; __setup_irq entry (a
 *   kprobe) keeps irq_lines up to date as drivers request MSI vectors, and
 *   pcibios_enable_device's return (a kretprobe) with the INTx line a
 *   device gets when its driver enables it;
 * - the dma tracepoints (6.12 and later) of a device in traced_devs -> DMA;
 * - remap_pfn_range entry (a kprobe) of a range in user_ranges (a traced
 *   range mapped into a process) -> a NOT-traced record (--no-user: the
 *   helper traces such mappings otherwise);
 * - an access through a process's mapping (MMIOTNG_F_USER) that has no map
 *   id in user_map_ids yet -> its MAP first (the process's pid, the user
 *   address); vm_area_free entry (a kprobe) of such a mapping -> its UNMAP.
 *
 * Everything goes into one ring buffer.  A failed reserve counts a drop on
 * this CPU; the next record of the CPU carries the count in hdr.lost, so
 * the loader prints "Lost N events" where the loss happened.
 *
 * Nothing about the devices is compiled in: the helper decides what is
 * traced, the loader writes the settings into the map "config" (see
 * mmiotrace_ng.h) and creates the ring buffer with the size asked for, so
 * one compiled object serves every device and buffer size.
 */
#include <uapi/linux/ptrace.h>
#include <linux/types.h>

#include "mmiotrace_ng.h"

/*
 * The kernel's struct members that the interrupt and DMA programs read sit
 * at the offsets the loader found in the kernel's BTF, given as -D flags
 * (mmiotrace_ng/tracer/layout.py): the kernel's own headers for them
 * (<linux/pci.h>, <linux/irq.h>, ...) make the compile six times as long.
 * A program whose members the BTF lacks is not compiled; the loader says
 * what is then not traced.
 */
#if defined(NG_OFF_DEVICE_NAME) && defined(NG_OFF_PCI_DEV_DEV) && \
	defined(NG_OFF_PCI_DEV_IRQ) && defined(NG_OFF_IRQACTION_NAME)
#define NG_IRQ_LAYOUT 1
#endif
#if defined(NG_OFF_DEVICE_NAME) && defined(NG_OFF_SG_PAGE_LINK) && \
	defined(NG_OFF_SG_DMA_ADDRESS) && defined(NG_SIZEOF_SCATTERLIST) && \
	(defined(NG_OFF_SG_DMA_LENGTH) || defined(NG_OFF_SG_LENGTH))
#define NG_DMA_LAYOUT 1
#endif
/* the low bits of scatterlist.page_link (include/linux/scatterlist.h) */
#define NG_SG_CHAIN	0x01UL
#define NG_SG_END	0x02UL
/* the address of member OFF of the kernel object at p */
#define NG_AT(p, off)	((const void *)((const char *)(p) + (off)))

/* what on_access copies from the helper's record into ours */
#define NG_SAME_SIZE(a, fa, b, fb) \
	_Static_assert(sizeof(((a *)0)->fa) == sizeof(((b *)0)->fb), #fa " of " #a " and " #b)
NG_SAME_SIZE(struct ng_rec_access, insn, struct mmiotng_access, insn);
NG_SAME_SIZE(struct ng_rec_access, value, struct mmiotng_access, value);
NG_SAME_SIZE(struct ng_rec_access, op, struct mmiotng_access, op);
NG_SAME_SIZE(struct ng_rec_access, width, struct mmiotng_access, width);
NG_SAME_SIZE(struct ng_rec_access, flags, struct mmiotng_access, flags);
NG_SAME_SIZE(struct ng_rec_untraced, err, struct mmiotng_map, err);

/* what on_access keeps per CPU (one lookup for both) */
struct ng_access_cpu {
	/* the map id of the mapping of this CPU's last access */
	u64 virt;
	u32 gen;	/* map_ids_gen[0] when it was looked up */
	s32 map_id;
	/* when this CPU's access records last let the ring buffer wake the reader */
	u64 woken_ns;
};

struct ng_ioremap_args {
	u64 phys;
	u64 size;
};

/* one page here; the loader creates it with the size asked for */
BPF_RINGBUF_OUTPUT(events, 1);
/* [0]: records dropped in all; [1]: dropped since this CPU's last record */
BPF_PERCPU_ARRAY(drops, u64, 2);
BPF_ARRAY(next_map_id, u32, 1);
/* ids being handed out: an insert that fails tells the id is taken */
BPF_HASH(claimed_ids, u32, u8, 64);
BPF_HASH(ioremap_args, u64, struct ng_ioremap_args, 1024);
BPF_HASH(map_ids, u64, s32, 4096);
/* processes' mappings (MMIOTNG_F_USER), by process and user address: a fork's copy is its own */
BPF_TABLE("lru_hash", struct ng_user_map_key, struct ng_user_map_val, user_map_ids, 4096);
/* enum ng_config slots, set by the loader before it arms anything */
BPF_ARRAY(config, u32, NG_CONFIG_SLOTS);
/* --histogram: accesses counted per (register, place); [0] of hist_full:
 * accesses not counted because the map was full
 */
BPF_HASH(hist, struct ng_hist_key, struct ng_hist_val, NG_HIST_ENTRIES);
BPF_ARRAY(hist_full, u64, 1);
/* [0]: bumped after every change of map_ids (access_cpu's ids are of one) */
BPF_ARRAY(map_ids_gen, u32, 1);
BPF_PERCPU_ARRAY(access_cpu, struct ng_access_cpu, 1);
/* interrupt number -> the traced device it is of (the loader fills it with
 * the lines and vectors the devices have at the start, on_setup_irq with
 * the vectors requested later)
 */
BPF_HASH(irq_lines, u32, struct ng_dev_name, NG_IRQ_LINES);
/* pcibios_enable_device's device, by the task enabling it */
BPF_HASH(enabling, u64, u64, 256);
/* the traced devices, by name (the value is unused) */
BPF_HASH(traced_devs, struct ng_dev_name, u8, NG_TRACED_DEVS);
/* the traced physical ranges, from [0] up to the first of size 0 */
BPF_ARRAY(user_ranges, struct ng_phys_range, NG_USER_RANGES);

/* map_ids changed: cached map ids are looked up again */
static __always_inline void ng_map_ids_changed(void)
{
	int zero = 0;
	u32 *gen = map_ids_gen.lookup(&zero);

	if (gen)
		__sync_fetch_and_add(gen, 1);
}

/*
 * The map id of the mapping at virt, -1 if none.  An access is most often
 * through the mapping of the one before it on its CPU: that one's id is
 * kept, valid until map_ids changes (the change is made before the bump,
 * so an id read before a change is not taken after it).
 */
static __always_inline s32 ng_map_id(struct ng_access_cpu *c, u64 virt)
{
	int zero = 0;
	s32 *found;
	u32 *gen;

	gen = map_ids_gen.lookup(&zero);
	if (!gen)
		return -1;
	if (c->virt == virt && c->gen == *gen)
		return c->map_id;
	c->gen = *gen;
	found = map_ids.lookup(&virt);
	c->virt = virt;
	c->map_id = found ? *found : -1;
	return c->map_id;
}

static __always_inline u32 ng_config(int slot)
{
	u32 *v = config.lookup(&slot);

	return v ? *v : 0;
}

/*
 * Whether the current task belongs to the tracer: with --all, mappings the
 * tracer's own process makes (if any) are not a driver's and stay out of
 * the trace.
 */
static __always_inline int ng_by_tracer(void)
{
	return ng_config(NG_CONFIG_TRACER) == (u32)(bpf_get_current_pid_tgid() >> 32);
}

/* A record that could not be made: counted, and reported with the next. */
static __always_inline void ng_count_drop(void)
{
	int total = 0, pending = 1;
	u64 *t, *p;

	t = drops.lookup(&total);
	p = drops.lookup(&pending);
	if (t)
		(*t)++;
	if (p)
		(*p)++;
}

/* n accesses the helper could not report: counted, reported with the next */
static __always_inline void ng_count_drops(u32 n)
{
	int total = 0, pending = 1;
	u64 *t, *p;

	if (!n)
		return;
	t = drops.lookup(&total);
	p = drops.lookup(&pending);
	if (t)
		*t += n;
	if (p)
		*p += n;
}

/* A record of size bytes, stamped ts_ns (0: now) */
static __always_inline void *ng_reserve_at(u32 size, u16 type, u64 ts_ns)
{
	struct ng_rec_hdr *hdr = events.ringbuf_reserve(size);
	int pending = 1;
	u64 *p;

	if (!hdr) {
		ng_count_drop();
		return 0;
	}
	p = drops.lookup(&pending);
	/* with hpet as the clock, a read is an emulated device access: one */
	hdr->ts_ns = ts_ns ? ts_ns : bpf_ktime_get_ns();
	hdr->type = type;
	hdr->cpu = bpf_get_smp_processor_id();
	hdr->lost = 0;
	if (p) {
		hdr->lost = *p;
		*p = 0;
	}
	return hdr;
}

static __always_inline void *ng_reserve(u32 size, u16 type)
{
	return ng_reserve_at(size, type, 0);
}

/*
 * The next map id, counted from 1.  This kernel's BPF has no fetch-and-add
 * with a result, so an id is claimed by inserting it into claimed_ids:
 * the insert of the loser of a race fails and it tries the next id.
 */
static __always_inline s32 ng_new_map_id(void)
{
	int zero = 0, i;
	u32 *ctr = next_map_id.lookup(&zero);
	u32 id, old;
	u8 one = 1;

	if (!ctr)
		return -1;
	id = *ctr;
#pragma unroll
	for (i = 0; i < 8; i++) {
		id++;
		if (claimed_ids.insert(&id, &one) == 0) {
			if (*ctr < id)
				*ctr = id;
			old = id - 32;
			claimed_ids.delete(&old);
			return id;
		}
	}
	return -1;
}

int on_ioremap_entry(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	struct ng_ioremap_args a = {
		.phys = PT_REGS_PARM1(ctx),
		.size = PT_REGS_PARM2(ctx),
	};

	if (!ng_config(NG_CONFIG_ALL) || ng_by_tracer())
		return 0;
	/*
	 * The ioremap functions do not call each other: an entry of this
	 * thread still here means the return probe missed that call (more
	 * calls in flight than it has instances), and its MAP was lost.
	 */
	if (ioremap_args.lookup(&id))
		ng_count_drop();
	ioremap_args.update(&id, &a);
	return 0;
}

int on_ioremap_return(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	struct ng_ioremap_args *a = ioremap_args.lookup(&id);
	u64 virt = PT_REGS_RC(ctx);
	struct ng_rec_map *r;
	s32 map_id;

	if (!a)
		return 0;
	/* no mapping, or one the helper armed: its MAP is out already */
	if (!virt || map_ids.lookup(&virt))
		goto out;
	map_id = ng_new_map_id();
	map_ids.update(&virt, &map_id);
	ng_map_ids_changed();
	r = ng_reserve(sizeof(*r), NG_REC_MAP);
	if (!r)
		goto out;
	r->phys = a->phys;
	r->virt = virt;
	r->len = a->size;
	r->ip = 0;
	r->map_id = map_id;
	r->pid = id;
	events.ringbuf_submit(r, 0);
out:
	ioremap_args.delete(&id);
	return 0;
}

/* The helper armed a mapping (its MAP), or left one of a traced range unarmed. */
int on_map(struct bpf_raw_tracepoint_args *ctx)
{
	const struct mmiotng_map *m = (const void *)ctx->args[0];
	struct ng_rec_untraced *u;
	struct mmiotng_map ev;
	struct ng_rec_map *r;
	s32 map_id;

	if (bpf_probe_read_kernel(&ev, sizeof(ev), m))
		return 0;
	if (ev.err) {
		u = ng_reserve(sizeof(*u), NG_REC_UNTRACED);
		if (!u)
			return 0;
		u->phys = ev.phys;
		u->virt = ev.virt;
		u->len = ev.size;
		u->err = ev.err;
		u->pid = ev.pid ? ev.pid : (u32)bpf_get_current_pid_tgid();
		events.ringbuf_submit(u, 0);
		return 0;
	}
	map_id = ng_new_map_id();
	map_ids.update(&ev.virt, &map_id);
	ng_map_ids_changed();
	r = ng_reserve(sizeof(*r), NG_REC_MAP);
	if (!r)
		return 0;
	r->phys = ev.phys;
	r->virt = ev.virt;
	r->len = ev.size;
	r->ip = 0;
	r->map_id = map_id;
	r->pid = bpf_get_current_pid_tgid();
	events.ringbuf_submit(r, 0);
	return 0;
}

int on_iounmap(struct pt_regs *ctx)
{
	u64 virt = PT_REGS_PARM1(ctx);
	s32 *found = map_ids.lookup(&virt);
	struct ng_rec_unmap *r;
	s32 map_id = -1;

	if (ng_by_tracer())
		return 0;
	if (found) {
		map_id = *found;
		map_ids.delete(&virt);
		ng_map_ids_changed();
	} else if (!ng_config(NG_CONFIG_ALL)) {
		return 0;
	}
	r = ng_reserve(sizeof(*r), NG_REC_UNMAP);
	if (!r)
		return 0;
	r->virt = virt;
	r->ip = 0;
	r->map_id = map_id;
	r->pid = bpf_get_current_pid_tgid();
	events.ringbuf_submit(r, 0);
	return 0;
}

/*
 * How an access record is submitted.  Each wake-up of the reader is an
 * irq_work on this CPU and a wake-up IPI to the reader's, which a reader
 * that keeps up got for every record.  So a CPU's access records wake the
 * reader at most every NG_WAKE_NS, and then whether or not it has read
 * everything before them (the ring buffer's own rule would not wake a
 * reader that fell asleep with records unread); the others go in without.
 * The reader also looks every 100 ms, and MARK records always wake it: a
 * record waits at most that long, and one followed by others at most
 * NG_WAKE_NS.
 */
static __always_inline u64 ng_access_wakeup(struct ng_access_cpu *c, u64 now)
{
	if (now - c->woken_ns < NG_WAKE_NS)
		return BPF_RB_NO_WAKEUP;
	c->woken_ns = now;
	return BPF_RB_FORCE_WAKEUP;
}

/* --histogram: one more access of this register from this place */
static __always_inline void ng_count_access(const struct mmiotng_access *acc)
{
	struct ng_hist_key k = {
		.phys = acc->phys, .ip = acc->ip, .op = acc->op, .width = acc->width,
	};
	struct ng_hist_val init = {}, *v;
	int zero = 0;
	u64 *full;

	v = hist.lookup_or_try_init(&k, &init);
	if (!v) {
		full = hist_full.lookup(&zero);
		if (full)
			__sync_fetch_and_add(full, 1);
		return;
	}
	__sync_fetch_and_add(&v->count, 1);
	v->last = acc->value;
	v->last_ns = bpf_ktime_get_ns();
}

/* The current task's address space (its tgid where the BTF did not say where it is) */
static __always_inline u64 ng_current_mm(void)
{
#ifdef NG_OFF_TASK_MM
	const void *task = (const void *)bpf_get_current_task();
	u64 mm = 0;

	bpf_probe_read_kernel(&mm, sizeof(mm), NG_AT(task, NG_OFF_TASK_MM));
	return mm;
#else
	return bpf_get_current_pid_tgid() >> 32;
#endif
}

/*
 * The map id of a process's mapping (an access with MMIOTNG_F_USER): the
 * first access of each process through it gives it one, and its MAP (the
 * helper arms a mapping without a record: a fork's copy is armed without
 * it knowing).  -1 if the MAP could not be made: no id is kept then, so the
 * next access tries again.  The least recently used of more than the map
 * holds is forgotten: its next access makes a new MAP.
 */
static __always_inline s32 ng_user_map_id(const struct mmiotng_access *acc)
{
	struct ng_user_map_key k = { .virt = acc->map_virt, .mm = ng_current_mm() };
	struct ng_user_map_val v = { .tgid = bpf_get_current_pid_tgid() >> 32 };
	struct ng_user_map_val *found;
	struct ng_rec_map *m;

	found = user_map_ids.lookup(&k);
	if (found)
		return found->map_id;
	v.map_id = ng_new_map_id();
	if (v.map_id < 0)
		return -1;
	/* two threads' first accesses at once: one MAP, the loser takes its id */
	if (user_map_ids.insert(&k, &v)) {
		found = user_map_ids.lookup(&k);
		return found ? found->map_id : -1;
	}
	/* the access's stamp where the helper made one: not after it */
	m = ng_reserve_at(sizeof(*m), NG_REC_MAP, acc->ts_ns);
	if (!m) {
		user_map_ids.delete(&k);	/* the next access tries again */
		return -1;
	}
	m->phys = acc->map_phys;
	m->virt = acc->map_virt;
	m->len = acc->map_len;
	m->ip = 0;
	m->map_id = v.map_id;
	m->pid = v.tgid;
	events.ringbuf_submit(m, 0);
	return v.map_id;
}

#if defined(NG_OFF_VMA_START) && defined(NG_OFF_VMA_MM) && defined(NG_OFF_TASK_MM)
/* A process's VMA goes: one that has a map id here gets its UNMAP. */
static __always_inline int ng_user_unmap(const void *vma)
{
	struct ng_user_map_key k = {};
	struct ng_user_map_val *v;
	struct ng_rec_unmap *r;

	if (bpf_probe_read_kernel(&k.virt, sizeof(k.virt), NG_AT(vma, NG_OFF_VMA_START)) ||
	    bpf_probe_read_kernel(&k.mm, sizeof(k.mm), NG_AT(vma, NG_OFF_VMA_MM)))
		return 0;
	v = user_map_ids.lookup(&k);
	if (!v)
		return 0;
	r = ng_reserve(sizeof(*r), NG_REC_UNMAP);
	if (r) {
		r->virt = k.virt;
		r->ip = 0;
		r->map_id = v->map_id;
		r->pid = v->tgid;
		events.ringbuf_submit(r, 0);
	}
	user_map_ids.delete(&k);
	return 0;
}

/*
 * vm_area_free() entry (a kprobe): munmap, exec, the old place of an
 * mremap, the part of a split that went, and exit where it frees through
 * here (not 6.4 to 6.13's: __vm_area_free() below).
 */
int on_vm_area_free(struct pt_regs *ctx)
{
	return ng_user_unmap((const void *)PT_REGS_PARM1(ctx));
}

#ifdef NG_OFF_MM_USERS
/*
 * __vm_area_free() entry (6.4 to 6.13, where vm_area_free() frees after a
 * grace period through it): an address space torn down (exit, exec's old
 * one: no user left) frees its VMAs here directly.  The VMAs of a live
 * one come here a grace period after vm_area_free() saw them (their
 * place may hold a new mapping by then): left alone.
 */
int on___vm_area_free(struct pt_regs *ctx)
{
	const void *vma = (const void *)PT_REGS_PARM1(ctx);
	const void *mm;
	int users;

	if (bpf_probe_read_kernel(&mm, sizeof(mm), NG_AT(vma, NG_OFF_VMA_MM)) || !mm ||
	    bpf_probe_read_kernel(&users, sizeof(users), NG_AT(mm, NG_OFF_MM_USERS)) || users)
		return 0;
	return ng_user_unmap(vma);
}
#endif
#endif

/*
 * on_access is a raw_tracepoint.w program: the helper's access tracepoint
 * is writable, its buffer the record, which is copied from there with
 * plain loads (the verifier bounds each by the record's size), not a
 * probe read.  Nothing writes to it.  (A copy, not reads of its fields:
 * bcc would make each read through a pointer from the context a probe
 * read.)
 */
int on_access(struct bpf_raw_tracepoint_args *ctx)
{
	const struct mmiotng_access *a = (const void *)ctx->args[0];
	struct mmiotng_access acc;
	struct ng_rec_access *r;
	struct ng_access_cpu *c;
	int zero = 0;
	s32 map_id;

	__builtin_memcpy(&acc, a, sizeof(acc));
	if (ng_config(NG_CONFIG_HISTOGRAM)) {
		ng_count_access(&acc);
		ng_count_drops(acc.lost);
		return 0;
	}
	c = access_cpu.lookup(&zero);
	if (!c) {		/* never: an array's slot 0 */
		ng_count_drops(acc.lost + 1);
		return 0;
	}
	/*
	 * The helper's stamp where it made one: a single-stepped access is
	 * reported a little after it happened; --flight and --sync stamp each
	 * emulated access for their own records.
	 */
	/* first: a process's first access through a mapping makes its MAP */
	if (acc.flags & MMIOTNG_F_USER)
		map_id = ng_user_map_id(&acc);
	else
		map_id = ng_map_id(c, acc.map_virt);
	r = ng_reserve_at(sizeof(*r), NG_REC_ACCESS, acc.ts_ns);
	if (!r) {
		ng_count_drops(acc.lost);	/* this one was counted */
		return 0;
	}
	/* accesses the helper could not report (its NMI queue was full) */
	if (acc.lost) {
		int total = 0;
		u64 *t = drops.lookup(&total);

		r->hdr.lost += acc.lost;
		if (t)
			*t += acc.lost;
	}
	r->map_id = map_id;
	r->phys = acc.phys;
	r->value = acc.value;
	r->compat_value = acc.compat_value;
	r->ip = acc.ip;
	r->pid = bpf_get_current_pid_tgid();
	r->width = acc.width;
	r->op = acc.op;
	r->compat_width = acc.compat_width;
	r->compat_op = acc.compat_op;
	r->insn_len = acc.insn_len;
	r->flags = acc.flags;
	__builtin_memcpy(r->insn, acc.insn, sizeof(r->insn));
	events.ringbuf_submit(r, ng_access_wakeup(c, r->hdr.ts_ns));
	return 0;
}

/*
 * remap_pfn_range() entry (a kprobe): a driver maps device memory into a
 * process: a sysfs resourceN file's mmap, a driver's own mmap.  One
 * that covers a traced range makes a NOT-traced record (NG_ERR_USER_MAP)
 * with the user address and the process: its accesses from user space are
 * not traced, and the trace says so.
 */
int on_remap_pfn_range(struct pt_regs *ctx)
{
	u64 addr = PT_REGS_PARM2(ctx);
	u64 start = (u64)PT_REGS_PARM3(ctx) << 12;	/* the frame number */
	u64 size = PT_REGS_PARM4(ctx);
	struct ng_rec_untraced *u;
	struct ng_phys_range *r;
	u32 i;

	for (i = 0; i < NG_USER_RANGES; i++) {
		u32 key = i;	/* i itself stays in a register: the verifier sees it grow */

		r = user_ranges.lookup(&key);
		if (!r || !r->size)
			return 0;
		if (start < r->start + r->size && r->start < start + size)
			break;
	}
	if (i == NG_USER_RANGES)
		return 0;
	u = ng_reserve(sizeof(*u), NG_REC_UNTRACED);
	if (!u)
		return 0;
	u->phys = start;
	u->virt = addr;
	u->len = size;
	u->err = -NG_ERR_USER_MAP;
	u->pid = bpf_get_current_pid_tgid() >> 32;
	events.ringbuf_submit(u, 0);
	return 0;
}

int on_mark(struct bpf_raw_tracepoint_args *ctx)
{
	const char *text = (const char *)ctx->args[0];
	u32 len = ctx->args[1];
	struct ng_rec_mark *r;

	r = ng_reserve(sizeof(*r), NG_REC_MARK);
	if (!r)
		return 0;
	if (len > NG_MARK_MAX)
		len = NG_MARK_MAX;
	r->len = len;
	r->pid = bpf_get_current_pid_tgid();
	/* the helper's buffer always holds NG_MARK_MAX bytes */
	bpf_probe_read_kernel(r->text, NG_MARK_MAX, text);
	events.ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	return 0;
}

#if defined(NG_IRQ_LAYOUT) || defined(NG_DMA_LAYOUT)
/* Whether dev is a traced device; its name into d (zeros after it). */
static __always_inline int ng_traced_dev(const void *dev, struct ng_dev_name *d)
{
	const char *name = NULL;

	__builtin_memset(d, 0, sizeof(*d));
	if (dev)
		bpf_probe_read_kernel(&name, sizeof(name), NG_AT(dev, NG_OFF_DEVICE_NAME));
	if (!name || bpf_probe_read_kernel_str(d->name, sizeof(d->name), name) <= 0)
		return 0;
	return traced_devs.lookup(d) != NULL;
}
#endif

#ifdef NG_IRQ_LAYOUT
/*
 * __setup_irq(irq, desc, action) entry: a handler is being installed.  If
 * the interrupt is an MSI/MSI-X vector of a traced device, it goes into
 * irq_lines; a vector of another device leaves it (its number may have been
 * a traced device's before).  Lines that are not MSI (INTx) have no device
 * here: the loader put the traced devices' in at the start.
 */
int on_setup_irq(struct pt_regs *ctx)
{
#if defined(NG_OFF_IRQ_DESC_MSI_DESC) && defined(NG_OFF_MSI_DESC_DEV)
	const void *desc = (const void *)PT_REGS_PARM2(ctx);
	u32 irq = (u32)PT_REGS_PARM1(ctx);
	const void *msi = NULL;
	struct ng_dev_name d;
	const void *dev = NULL;

	bpf_probe_read_kernel(&msi, sizeof(msi), NG_AT(desc, NG_OFF_IRQ_DESC_MSI_DESC));
	if (!msi)
		return 0;
	bpf_probe_read_kernel(&dev, sizeof(dev), NG_AT(msi, NG_OFF_MSI_DESC_DEV));
	if (ng_traced_dev(dev, &d))
		irq_lines.update(&irq, &d);
	else
		irq_lines.delete(&irq);
#endif
	return 0;
}

/* pcibios_enable_device(dev, mask) entry: the device, for the return */
int on_pci_enable(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u64 dev = PT_REGS_PARM1(ctx);

	enabling.update(&id, &dev);
	return 0;
}

/*
 * pcibios_enable_device's return: the device's INTx line is set now (it
 * may not have been before its driver enabled it).  A traced device's goes
 * into irq_lines.
 */
int on_pci_enable_return(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	const void *pdev;
	struct ng_dev_name d;
	u32 irq = 0;
	u64 *dev;

	dev = enabling.lookup(&id);
	if (!dev)
		return 0;
	pdev = (const void *)*dev;
	enabling.delete(&id);
	if ((int)PT_REGS_RC(ctx))
		return 0;
	bpf_probe_read_kernel(&irq, sizeof(irq), NG_AT(pdev, NG_OFF_PCI_DEV_IRQ));
	if (irq && ng_traced_dev(NG_AT(pdev, NG_OFF_PCI_DEV_DEV), &d))
		irq_lines.update(&irq, &d);
	return 0;
}

/* IRQ record of a handler's entry (exit 0) or exit (1, with its result) */
static __always_inline int ng_irq(struct bpf_raw_tracepoint_args *ctx, u8 exit)
{
	const void *action = (const void *)ctx->args[1];
	u32 irq = (u32)ctx->args[0];
	const char *name = NULL;
	struct ng_dev_name *d;
	struct ng_rec_irq *r;

	d = irq_lines.lookup(&irq);
	if (!d || ng_config(NG_CONFIG_HISTOGRAM))
		return 0;
	r = ng_reserve(sizeof(*r), NG_REC_IRQ);
	if (!r)
		return 0;
	r->irq = irq;
	r->pid = bpf_get_current_pid_tgid();
	r->exit = exit;
	r->ret = exit ? (u8)ctx->args[2] : 0;
	__builtin_memset(r->pad, 0, sizeof(r->pad));
	__builtin_memcpy(r->dev, d->name, sizeof(r->dev));
	__builtin_memset(r->handler, 0, sizeof(r->handler));
	bpf_probe_read_kernel(&name, sizeof(name), NG_AT(action, NG_OFF_IRQACTION_NAME));
	if (name)
		bpf_probe_read_kernel_str(r->handler, sizeof(r->handler), name);
	events.ringbuf_submit(r, 0);
	return 0;
}

int on_irq_entry(struct bpf_raw_tracepoint_args *ctx)
{
	return ng_irq(ctx, 0);
}

int on_irq_exit(struct bpf_raw_tracepoint_args *ctx)
{
	return ng_irq(ctx, 1);
}

#endif /* NG_IRQ_LAYOUT */

#ifdef NG_DMA_LAYOUT
/* One DMA record: kind of a traced device's mapping of size bytes at addr. */
static __always_inline void ng_dma(struct ng_dev_name *d, u8 kind, u64 addr, u64 size,
				   u64 phys, u64 dir)
{
	struct ng_rec_dma *r;

	if (ng_config(NG_CONFIG_HISTOGRAM))
		return;
	r = ng_reserve(sizeof(*r), NG_REC_DMA);
	if (!r)
		return;
	r->addr = addr;
	r->size = size;
	r->phys = phys;
	r->pid = bpf_get_current_pid_tgid();
	r->kind = kind;
	r->dir = dir;
	r->pad[0] = 0;
	r->pad[1] = 0;
	__builtin_memcpy(r->dev, d->name, sizeof(r->dev));
	events.ringbuf_submit(r, 0);
}

/* dma_map_page/resource(dev, phys, dma_addr, size, dir, attrs) */
int on_dma_map(struct bpf_raw_tracepoint_args *ctx)
{
	struct ng_dev_name d;

	if (ng_traced_dev((const void *)ctx->args[0], &d))
		ng_dma(&d, NG_DMA_MAP, ctx->args[2], ctx->args[3], ctx->args[1], ctx->args[4]);
	return 0;
}

/* dma_unmap_page/resource(dev, addr, size, dir, attrs) */
int on_dma_unmap(struct bpf_raw_tracepoint_args *ctx)
{
	struct ng_dev_name d;

	if (ng_traced_dev((const void *)ctx->args[0], &d))
		ng_dma(&d, NG_DMA_UNMAP, ctx->args[1], ctx->args[2], 0, ctx->args[3]);
	return 0;
}

/* dma_alloc/alloc_pages(dev, virt, dma_addr, size, dir, gfp, attrs) */
int on_dma_alloc(struct bpf_raw_tracepoint_args *ctx)
{
	struct ng_dev_name d;

	if (ng_traced_dev((const void *)ctx->args[0], &d))
		ng_dma(&d, NG_DMA_ALLOC, ctx->args[2], ctx->args[3], ctx->args[1], ctx->args[4]);
	return 0;
}

/* dma_free/free_pages(dev, virt, dma_addr, size, dir, attrs) */
int on_dma_free(struct bpf_raw_tracepoint_args *ctx)
{
	struct ng_dev_name d;

	if (ng_traced_dev((const void *)ctx->args[0], &d))
		ng_dma(&d, NG_DMA_FREE, ctx->args[2], ctx->args[3], ctx->args[1], ctx->args[4]);
	return 0;
}

/* the entries of a scatterlist at most (more are counted as dropped) */
#define NG_DMA_SG_MAX	8
/* the list's chain links followed at most on the way */
#define NG_DMA_SG_LINKS	2

/*
 * The first n entries of a mapped scatterlist, each a record: its bus
 * address and length (sg_dma_address, sg_dma_len), its page's physical
 * address unknown here (0).  Chain links are followed (not entries, as
 * for_each_sg); an entry of length 0 (not mapped: dma_unmap_sg passes the
 * list's whole length) makes no record.
 */
static __always_inline void ng_dma_sg(struct bpf_raw_tracepoint_args *ctx, u8 kind,
				      int n, u64 dir)
{
	const char *sg = (const char *)ctx->args[1];
	struct ng_dev_name d;
	unsigned long link;
	int i, done = 0;
	u64 addr;
	u32 len;

	if (!ng_traced_dev((const void *)ctx->args[0], &d))
		return;
	for (i = 0; i < NG_DMA_SG_MAX + NG_DMA_SG_LINKS; i++) {
		if (done >= n || done >= NG_DMA_SG_MAX || !sg)
			break;
		link = 0;
		bpf_probe_read_kernel(&link, sizeof(link), NG_AT(sg, NG_OFF_SG_PAGE_LINK));
		if (link & NG_SG_CHAIN) {
			sg = (const char *)(link & ~(NG_SG_CHAIN | NG_SG_END));
			continue;
		}
		addr = 0;
		len = 0;
		bpf_probe_read_kernel(&addr, sizeof(addr), NG_AT(sg, NG_OFF_SG_DMA_ADDRESS));
#ifdef NG_OFF_SG_DMA_LENGTH	/* CONFIG_NEED_SG_DMA_LENGTH */
		bpf_probe_read_kernel(&len, sizeof(len), NG_AT(sg, NG_OFF_SG_DMA_LENGTH));
#else
		bpf_probe_read_kernel(&len, sizeof(len), NG_AT(sg, NG_OFF_SG_LENGTH));
#endif
		if (len)
			ng_dma(&d, kind, addr, len, 0, dir);
		done++;
		if (link & NG_SG_END)
			return;
		sg += NG_SIZEOF_SCATTERLIST;
	}
	if (n > done)
		ng_count_drops(n - done);
}

/* dma_map_sg(dev, sgl, nents, ents, dir, attrs): ents entries mapped */
int on_dma_map_sg(struct bpf_raw_tracepoint_args *ctx)
{
	ng_dma_sg(ctx, NG_DMA_MAP_SG, (int)ctx->args[3], ctx->args[4]);
	return 0;
}

/* dma_unmap_sg(dev, sgl, nents, dir, attrs) */
int on_dma_unmap_sg(struct bpf_raw_tracepoint_args *ctx)
{
	ng_dma_sg(ctx, NG_DMA_UNMAP_SG, (int)ctx->args[2], ctx->args[3]);
	return 0;
}
#endif /* NG_DMA_LAYOUT */
