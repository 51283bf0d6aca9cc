// SPDX-License-Identifier: GPL-2.0
/*
 * tcg_int3 - a kretprobe on tracing_mark_write() and nothing else
 *
 * Loading it arms the probe (an int3 at the function's first instruction,
 * later optimized into a jump); unloading it removes it again.  The probe
 * does nothing: the module exists to patch that code in and out while
 * another CPU writes trace_marker in a loop (see README.md).
 */
#include <linux/kprobes.h>
#include <linux/module.h>

static int tcg_int3_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	return 0;
}

static struct kretprobe tcg_int3_probe = {
	.kp.symbol_name = "tracing_mark_write",
	.handler = tcg_int3_ret,
};

static int __init tcg_int3_init(void)
{
	return register_kretprobe(&tcg_int3_probe);
}

static void __exit tcg_int3_exit(void)
{
	unregister_kretprobe(&tcg_int3_probe);
}

module_init(tcg_int3_init);
module_exit(tcg_int3_exit);
MODULE_DESCRIPTION("A kretprobe on tracing_mark_write(), armed at load, removed at unload");
MODULE_LICENSE("GPL");
