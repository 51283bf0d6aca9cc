// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: hooks into the kernel's tracing code.
 *
 * - trace_marker: tracing_mark_write() is notrace, so BPF cannot probe
 *   it.  A kretprobe sees each write return; the text the write took from
 *   user space is copied again (copy_from_user_nofault, exactly as
 *   tracing_mark_write() copies it) into a per-CPU buffer and handed to the
 *   tracepoint mmiotng_mark, where BPF attaches.  A write that faulted is
 *   "<faulted>", as the kernel's tracer prints it.  Nothing runs outside
 *   the probe handlers: unregistering the probes leaves no code of this
 *   module in flight.
 * - The kernel's own mmiotrace: mmio_trace_init()/mmio_trace_reset() are
 *   probed so that it and an mmiotrace-ng session exclude each other
 *   through one atomic state (ng_kernel_tracer_start, mmiotng_ctl.c).  Its
 *   start is refused with -EBUSY while a session is active, by sending the
 *   probed call to ng_refuse_mmiotrace() (a redirection, not a call of the
 *   original; kprobes with a post_handler are never optimized into jumps,
 *   which would ignore the new ip).
 *
 * Locking in this file:
 *  - The kretprobe handlers run in probe context (preemption off), on any
 *    CPU at once; each uses only its CPU's buffer.  Marker writes are
 *    system calls: a handler is never nested in another on its CPU.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kprobes.h>
#include <linux/uaccess.h>
#include <linux/string.h>

#include "mmiotng.h"
#include "mmiotng_trace.h"

#define NG_FAULTED	"<faulted>"

struct ng_mark_args {
	const char __user *ubuf;
};

struct ng_mark_buf {
	char text[MMIOTNG_MARK_MAX + 1];
};

/* allocated: a page per CPU is too much for a module's static per-CPU area */
static struct ng_mark_buf __percpu *ng_mark_buf;

static int ng_mark_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ng_mark_args *a = (void *)ri->data;

	a->ubuf = (const char __user *)regs_get_kernel_argument(regs, 1);
	return 0;
}

static int ng_mark_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ng_mark_args *a = (void *)ri->data;
	long ret = regs_return_value(regs);
	char *buf = this_cpu_ptr(ng_mark_buf)->text;
	/* what the kernel kept: it returns the bytes written, cut to its limit */
	size_t len = ret > 0 ? min_t(size_t, ret, MMIOTNG_MARK_MAX) : 0;

	if (ret <= 0 && ret != -EFAULT)
		return 0;
	if (ret == -EFAULT || copy_from_user_nofault(buf, a->ubuf, len)) {
		len = sizeof(NG_FAULTED) - 1;
		memcpy(buf, NG_FAULTED, len);
	}
	/* BPF reads MMIOTNG_MARK_MAX bytes whatever len is */
	memset(buf + len, 0, MMIOTNG_MARK_MAX + 1 - len);
	trace_mmiotng_mark(buf, len);
	return 0;
}

static struct kretprobe ng_mark_probe = {
	.kp.symbol_name = "tracing_mark_write",
	.entry_handler = ng_mark_entry,
	.handler = ng_mark_ret,
	.data_size = sizeof(struct ng_mark_args),
};

/* ---- the kernel's own mmiotrace ------------------------------------- */

static bool ng_kguard;	/* the mmio_trace_init/reset probes are in place */

static void ng_no_post(struct kprobe *p, struct pt_regs *regs, unsigned long flags)
{
}

static int ng_refuse_mmiotrace(void *tr)
{
	pr_warn("refusing the kernel's mmiotrace: an mmiotrace-ng session is active\n");
	return -EBUSY;
}

static int ng_kinit_pre(struct kprobe *p, struct pt_regs *regs)
{
	if (!ng_kernel_tracer_start()) {
		instruction_pointer_set(regs, (unsigned long)ng_refuse_mmiotrace);
		return 1;
	}
	return 0;
}

static struct kprobe ng_kinit_probe = {
	.symbol_name = "mmio_trace_init",
	.pre_handler = ng_kinit_pre,
	.post_handler = ng_no_post,
};

static int ng_kreset_pre(struct kprobe *p, struct pt_regs *regs)
{
	ng_kernel_tracer_stop();
	return 0;
}

static struct kprobe ng_kreset_probe = {
	.symbol_name = "mmio_trace_reset",
	.pre_handler = ng_kreset_pre,
};

int ng_hooks_init(void)
{
	int ret;

	ng_mark_buf = alloc_percpu(struct ng_mark_buf);
	if (!ng_mark_buf)
		return -ENOMEM;
	ret = register_kretprobe(&ng_mark_probe);
	if (ret) {
		pr_err("cannot probe tracing_mark_write: %d\n", ret);
		free_percpu(ng_mark_buf);
		return ret;
	}
	/* kernels without CONFIG_MMIOTRACE have neither: nothing to guard */
	if (register_kprobe(&ng_kinit_probe))
		return 0;
	if (register_kprobe(&ng_kreset_probe)) {
		unregister_kprobe(&ng_kinit_probe);
		return 0;
	}
	ng_kguard = true;
	return 0;
}

void ng_hooks_exit(void)
{
	if (ng_kguard) {
		unregister_kprobe(&ng_kreset_probe);
		unregister_kprobe(&ng_kinit_probe);
	}
	unregister_kretprobe(&ng_mark_probe);
	free_percpu(ng_mark_buf);
}
