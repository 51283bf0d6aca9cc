// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: hooks into the kernel's tracing code.
 *
 * - trace_marker: tracing_mark_write() is notrace, so BPF cannot probe it.
 *   An int3 kprobe sends each call to ng_mark_write(), which calls the
 *   original and then hands the text to mmiotng_mark_hook(), where BPF
 *   attaches.  The text is copied in process context, outside any kprobe
 *   handler (a BPF kprobe nested in a kprobe handler would be skipped).
 * - The kernel's own mmiotrace: mmio_trace_init()/mmio_trace_reset() are
 *   probed to know whether it runs, and while an mmiotrace-ng session is
 *   active its start is refused with -EBUSY (it would offline CPUs and
 *   fight over the same faults).
 *
 * Both redirections change the probed call's ip from the pre-handler;
 * kprobes with a post_handler are never optimized into jumps, which would
 * ignore that.  Calls made from this module pass through unchanged.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/kprobes.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/fs.h>

#include "mmiotng.h"

static bool ng_kmmiotrace_on;
static bool ng_kguard;	/* the mmio_trace_init/reset probes are in place */

bool ng_kernel_mmiotrace_active(void)
{
	return READ_ONCE(ng_kmmiotrace_on);
}

/* The attach point for MARK records. */
noinline void mmiotng_mark_hook(const char *text, u32 len)
{
	asm volatile("" : : "r"(text), "r"(len) : "memory");
}
EXPORT_SYMBOL_GPL(mmiotng_mark_hook);

static void ng_no_post(struct kprobe *p, struct pt_regs *regs, unsigned long flags)
{
}

/* Was the probed function called from this module (our pass-through)? */
static bool ng_called_by_us(struct pt_regs *regs)
{
	unsigned long ret_addr;

	if (copy_from_kernel_nofault(&ret_addr, (void *)regs->sp, sizeof(ret_addr)))
		return false;
	return within_module(ret_addr, THIS_MODULE);
}

typedef ssize_t (*ng_write_fn)(struct file *, const char __user *, size_t, loff_t *);
static struct kprobe ng_mark_probe;

static ssize_t ng_mark_write(struct file *filp, const char __user *ubuf,
			     size_t cnt, loff_t *fpos)
{
	ssize_t ret = ((ng_write_fn)ng_mark_probe.addr)(filp, ubuf, cnt, fpos);
	size_t len = min_t(size_t, cnt, MMIOTNG_MARK_MAX);
	char *buf;

	if (ret <= 0 || !len)
		return ret;
	/* BPF reads MMIOTNG_MARK_MAX bytes whatever len is */
	buf = kzalloc(MMIOTNG_MARK_MAX + 1, GFP_KERNEL);
	if (!buf)
		return ret;
	if (!copy_from_user(buf, ubuf, len))
		mmiotng_mark_hook(buf, len);
	kfree(buf);
	return ret;
}

static int ng_mark_pre(struct kprobe *p, struct pt_regs *regs)
{
	if (ng_called_by_us(regs))
		return 0;
	instruction_pointer_set(regs, (unsigned long)ng_mark_write);
	return 1;
}

static struct kprobe ng_mark_probe = {
	.symbol_name = "tracing_mark_write",
	.pre_handler = ng_mark_pre,
	.post_handler = ng_no_post,
};

static int ng_refuse_mmiotrace(void *tr)
{
	pr_warn("refusing the kernel's mmiotrace: an mmiotrace-ng session is active\n");
	return -EBUSY;
}

static int ng_kinit_pre(struct kprobe *p, struct pt_regs *regs)
{
	if (ng_session_active()) {
		instruction_pointer_set(regs, (unsigned long)ng_refuse_mmiotrace);
		return 1;
	}
	WRITE_ONCE(ng_kmmiotrace_on, true);
	return 0;
}

static struct kprobe ng_kinit_probe = {
	.symbol_name = "mmio_trace_init",
	.pre_handler = ng_kinit_pre,
	.post_handler = ng_no_post,
};

static int ng_kreset_pre(struct kprobe *p, struct pt_regs *regs)
{
	WRITE_ONCE(ng_kmmiotrace_on, false);
	return 0;
}

static struct kprobe ng_kreset_probe = {
	.symbol_name = "mmio_trace_reset",
	.pre_handler = ng_kreset_pre,
};

int ng_hooks_init(void)
{
	int ret;

	ret = register_kprobe(&ng_mark_probe);
	if (ret) {
		pr_err("cannot probe tracing_mark_write: %d\n", ret);
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
	unregister_kprobe(&ng_mark_probe);
}
