/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What differs between the kernels the helper is built for (6.1 to 7.x),
 * as small helpers, so that the fault path carries no version #ifdefs.
 * The test driver (tests/drivers/edu_exerciser) includes it too.
 *
 * Context: every helper here may run in any context, NMI and the debug
 * trap included, unless its comment says otherwise; none sleeps.
 */
#ifndef MMIOTNG_COMPAT_H
#define MMIOTNG_COMPAT_H

#include <linux/irqflags.h>
#include <asm/cpufeature.h>
#include <asm/invpcid.h>
#include <asm/processor-flags.h>
#include <asm/special_insns.h>

/*
 * Drop every TLB entry of this CPU: global ones and those of every PCID,
 * as the kernel's __flush_tlb_all() does.  That function is exported to
 * the KVM modules only on newer kernels (7.x), flush_tlb_all() and
 * flush_tlb_kernel_range() never were: the instructions are the same.
 * INVPCID type 2 where the CPU has it, else a CR4.PGE toggle (a change of
 * PGE flushes all entries of all PCIDs), or without PGE (some virtual
 * CPUs: setting it would fault) a CR3 write.  Interrupts are kept off between
 * the two CR4 writes, so nothing runs with PGE flipped.  Native CPUs and
 * HVM guests only: ng_compat_check() refuses a Xen PV guest.
 */
static inline void ng_flush_tlb_local(void)
{
	unsigned long flags, cr4;

	if (cpu_feature_enabled(X86_FEATURE_INVPCID)) {
		invpcid_flush_all();
		return;
	}
	if (!boot_cpu_has(X86_FEATURE_PGE)) {
		/* no global pages (and no PCID): a CR3 write drops them all */
		native_write_cr3(__native_read_cr3());
		return;
	}
	raw_local_irq_save(flags);
	cr4 = native_read_cr4();
	asm volatile("mov %0, %%cr4" : : "r" (cr4 ^ X86_CR4_PGE) : "memory");
	asm volatile("mov %0, %%cr4" : : "r" (cr4) : "memory");
	raw_local_irq_restore(flags);
}

/*
 * Whether this machine can be served: 0, or a negative errno with the
 * reason in *why (load time, process context).
 */
static inline int ng_compat_check(const char **why)
{
	if (cpu_feature_enabled(X86_FEATURE_XENPV)) {
		*why = "a Xen PV guest: its page tables and TLB are the hypervisor's";
		return -ENODEV;
	}
	return 0;
}

#endif /* MMIOTNG_COMPAT_H */
