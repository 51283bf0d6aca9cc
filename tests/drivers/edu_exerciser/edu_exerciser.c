// SPDX-License-Identifier: GPL-2.0
/*
 * edu_exerciser - deterministic MMIO scenarios on QEMU's "edu" PCI device
 *
 * Binds to QEMU's edu device (PCI 1234:11e8, BAR0 = 1 MiB of MMIO) and runs
 * one MMIO scenario per write to debugfs:
 *
 *   echo "NAME [COUNT]" > /sys/kernel/debug/edu_exerciser/run
 *   cat /sys/kernel/debug/edu_exerciser/run          (lists the scenarios)
 *   cat /sys/kernel/debug/edu_exerciser/mismatches   (last "burst" run)
 *
 * Stress scenarios for the tracer's own safety tests have a file of their
 * own (same protocol), so that "run" lists only the scenarios compared
 * with the kernel's mmiotrace:
 *
 *   echo "NAME [COUNT]" > /sys/kernel/debug/edu_exerciser/stress
 *   cat /sys/kernel/debug/edu_exerciser/stress       (lists them)
 *   stride_virt, maploop_virt: the live mapping of stride / maploop, or 0
 *   bar_read: read(2) at OFF copies BAR0 + OFF with copy_to_user()
 *   bar_read_nostac: read(2) copies 4 bytes of BAR0 + 0 with one rep movsb
 *     and no stac: a driver's bug that oopses where the CPU has SMAP
 *   maploop_hold_us (rw): maploop's wait between ioremap and readl
 *   stride_flush (rw): nonzero: stride flushes its CPU's TLB every round
 *   errors: wrong values seen so far by the running (or last) scenario
 *   nmi_reads, nmi_second: the reads the last "nmi" run made in NMIs
 *   nmi_unknown (rw): nonzero: "nmi"'s second access is a testl of 0x00
 *   crossirq_reads: the reads the other CPU made in the last "crossirq"
 *   irq_handled, irq_vector: the interrupts the last "irq_intx"/"irq_msi"
 *     run's handler handled, and the Linux interrupt number it had
 *   dma_to, dma_from: the bus addresses of the last "dma" run's buffers
 *
 * The write returns once the scenario has finished: the number of bytes
 * written on success, -EINVAL for an unknown name or a bad COUNT, -EIO when a
 * value read from the device was not the one the device must return, -EINTR
 * when a loop was interrupted by a fatal signal, -ENOMEM when a mapping or a
 * buffer could not be made.
 *
 * Every run maps what it needs itself at its start (pci_iomap() of the whole
 * BAR0, or ioremap() of a sub-range) and unmaps it at its end, so a tracer
 * started before the write sees MAP ... UNMAP around the accesses.  The
 * exact record sequence each scenario must produce in the kernel's
 * mmiotrace format is in scenarios.py beside this file; README.md explains
 * how it was derived.
 *
 * The edu registers used (offsets from BAR0):
 *   0x00 ident (RO, 0x010000ed)     0x04 liveness (reads ~last write)
 *   0x20 status (0 while no factorial was started)  0x24 irq status (0)
 *   0x80/0x88 DMA source/destination (scratch while no DMA runs)
 *   0x40 and 0x1000.. unknown offsets: 4-byte reads give 0xffffffff,
 *   writes are ignored.
 *   0x08 factorial: by the stress scenario "fact" only (asynchronous)
 *   0x60 raise irq, 0x64 ack irq: by the stress scenarios "irq_intx" and
 *   "irq_msi" only (their handler reads 0x24 and acks what it read)
 *   0x90 DMA count, 0x98 DMA command: by the stress scenario "dma" only
 * edu only accepts 4- and 8-byte accesses: QEMU rejects 1- and 2-byte ones
 * before edu sees them, so such reads return 0 and such writes are ignored.
 * An 8-byte read below 0x80 returns all ones.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/cpu.h>
#include <linux/cpumask.h>
#include <linux/ctype.h>
#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/kprobes.h>
#include <linux/kthread.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/seq_file.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include <asm/apic.h>
#include <asm/cpufeature.h>
#include <asm/nmi.h>

/* ng_flush_tlb_local(): the helper's, as it differs between kernels */
#include "../../../kmod/mmiotng_compat.h"

#define EDU_VENDOR_ID		0x1234
#define EDU_DEVICE_ID		0x11e8

#define EDU_REG_IDENT		0x00
#define EDU_REG_LIVE		0x04
#define EDU_REG_FACT		0x08
#define EDU_REG_STATUS		0x20
#define EDU_STATUS_COMPUTING	0x01	/* a factorial is being computed */
#define EDU_REG_IRQ_STATUS	0x24
#define EDU_REG_IRQ_RAISE	0x60
#define EDU_REG_IRQ_ACK		0x64
#define EDU_REG_HOLE		0x40	/* no register there */
#define EDU_REG_DMA_SRC		0x80
#define EDU_REG_DMA_DST		0x88
#define EDU_REG_DMA_COUNT	0x90
#define EDU_REG_DMA_CMD		0x98
#define EDU_DMA_RUN		0x1	/* command: start; clear when done */
#define EDU_DMA_FROM_EDU	0x2	/* command: from edu's buffer to RAM */
#define EDU_DMA_BUF		0x40000	/* edu's own buffer, as a DMA address */
#define EDU_DMA_BITS		28	/* the addresses edu can reach */
#define EDU_DMA_LEN		2048	/* QEMU stops on a transfer of its whole buffer */
#define EDU_SPARE_PAGE		0x1000	/* first page without registers */

#define EDU_IDENT_VALUE		0x010000edU
#define EDU_NARROW_READ_B	0	/* what edu returns for 1-byte reads */
#define EDU_NARROW_READ_W	0	/* ... and for 2-byte reads */
#define EDU_HOLE_VALUE		0xffffffffU
#define EDU_HOLE_VALUE_Q	0xffffffffffffffffULL

#define EDU_MIN_BAR_LEN		0x2000
#define EDU_DEFAULT_COUNT	1000
#define EDU_MAX_COUNT		100000000U
#define EDU_CMD_MAX		64

#define EDU_IMM_VALUE		0xcafef00dU
#define EDU_XCHG_VALUE		0x600df00dU

struct edu_ex {
	struct pci_dev *pdev;
	resource_size_t start;
	resource_size_t len;
	resource_size_t moved_from;	/* BAR0's range before the last "move" */
	struct dentry *dir;
	struct mutex lock;	/* one scenario at a time */
	struct mutex hold_lock;	/* held, held_last; taken inside lock */
	unsigned int errors;	/* wrong values seen by the current run */
	u64 mismatches;		/* wrong values seen by the last burst run */
	int burst_cpu[2];	/* where the threads of the last burst ran */
	unsigned long stride_virt;	/* live mapping of "stride", or 0 */
	unsigned long maploop_virt;	/* live mapping of "maploop", or 0 */
	unsigned long wc_virt;		/* live mapping of "wc_loop", or 0 */
	u64 pc_read;			/* "pc": its readl instruction's address */
	u64 pc_write;			/* "pc": its writel instruction's address */
	u32 nonpci_value;		/* "nonpci": what it read */
	u32 memset_bytes;	/* the last "memset" stored byte by byte */
	u32 maploop_hold_us;	/* "maploop": wait between ioremap and readl */
	u32 stride_flush;	/* "stride": flush this CPU's TLB every round */
	u32 nmi_reads;		/* "nmi": readl 0x20 made in NMI handlers */
	u32 nmi_second;		/* "nmi": of them, followed by a second read */
	u32 nmi_unknown;	/* "nmi": the second access is a testl of 0x00 */
	u32 crossirq_reads;	/* "crossirq": reads of the other CPU */
	u64 dma_to;		/* "dma": bus address of the buffer sent to edu */
	u64 dma_from;		/* "dma": ... of the one edu wrote back */
	u32 irq_handled;	/* "irq_*": interrupts its handler handled */
	u32 irq_vector;		/* "irq_*": its Linux interrupt number */
	void __iomem *irq_base;	/* "irq_*": the mapping its handler uses */
	struct completion irq_done;	/* "irq_*": the handler acked one */
	void __iomem *held;	/* the mapping of "hold", or NULL; lock */
	unsigned long held_last;	/* where "unmap" unmapped it, or 0; lock */
};

struct edu_scenario {
	const char *name;
	int (*run)(struct edu_ex *ex, unsigned int count);
	bool counted;		/* takes COUNT */
	const char *help;
};

static void edu_check(struct edu_ex *ex, const char *what, u64 got, u64 want)
{
	if (got == want)
		return;
	/* the first of a run: a loop of them costs no more than a compare each */
	if (!ex->errors++)
		pr_err_ratelimited("%s: read 0x%llx, expected 0x%llx\n",
				   what, got, want);
}

static int edu_result(struct edu_ex *ex)
{
	return ex->errors ? -EIO : 0;
}

static void __iomem *edu_map(struct edu_ex *ex)
{
	return pci_iomap(ex->pdev, 0, 0);
}

static void edu_unmap(struct edu_ex *ex, void __iomem *base)
{
	pci_iounmap(ex->pdev, base);
}

/* Loops yield now and then and stop on a fatal signal. */
static int edu_loop_point(unsigned int i)
{
	if ((i & 1023) != 1023)
		return 0;
	cond_resched();
	return fatal_signal_pending(current) ? -EINTR : 0;
}

/*
 * A volatile store of a constant: gcc emits "movl $imm32, (%rdi)"
 * (c7 07 imm32), the mov-immediate form.  Kept out of line so that the
 * address is always in %rdi and needs no SIB byte.
 */
static noinline void edu_store_imm(void __iomem *reg)
{
	*(volatile u32 __force *)reg = EDU_IMM_VALUE;
}

/*
 * Instruction forms that arch/x86/mm/pf_in.c does not decode.  The address
 * register and the displacement are fixed so that the first three bytes
 * are always the same.
 */
static noinline void edu_or_live(void __iomem *base)
{
	/* 83 4f 04 01 */
	asm volatile("orl $0x1, 0x4(%0)" : : "D" (base) : "memory", "cc");
}

static noinline u32 edu_xchg_live(void __iomem *base, u32 val)
{
	/* 87 47 04 */
	asm volatile("xchgl %0, 0x4(%1)" : "+a" (val) : "D" (base) : "memory");
	return val;
}

static noinline bool edu_test_ident(void __iomem *base)
{
	bool nonzero;

	/* f7 07 ed 00 00 01 */
	asm volatile("testl $0x10000ed, (%1)\n\t"
		     "setnz %0"
		     : "=q" (nonzero) : "D" (base) : "memory", "cc");
	return nonzero;
}

static int sc_readb(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	edu_check(ex, "readb ident", readb(base + EDU_REG_IDENT),
		  EDU_NARROW_READ_B);
	edu_check(ex, "readb live", readb(base + EDU_REG_LIVE),
		  EDU_NARROW_READ_B);
	edu_check(ex, "readb dma src", readb(base + EDU_REG_DMA_SRC),
		  EDU_NARROW_READ_B);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_readw(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	edu_check(ex, "readw ident", readw(base + EDU_REG_IDENT),
		  EDU_NARROW_READ_W);
	edu_check(ex, "readw dma src", readw(base + EDU_REG_DMA_SRC),
		  EDU_NARROW_READ_W);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_readl(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	edu_check(ex, "readl ident", readl(base + EDU_REG_IDENT),
		  EDU_IDENT_VALUE);
	edu_check(ex, "readl status", readl(base + EDU_REG_STATUS), 0);
	edu_check(ex, "readl irq status", readl(base + EDU_REG_IRQ_STATUS), 0);
	edu_check(ex, "readl hole", readl(base + EDU_REG_HOLE),
		  EDU_HOLE_VALUE);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_readq(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	writeq(0x0123456789abcdefULL, base + EDU_REG_DMA_SRC);
	edu_check(ex, "readq dma src", readq(base + EDU_REG_DMA_SRC),
		  0x0123456789abcdefULL);
	edu_check(ex, "readq ident", readq(base + EDU_REG_IDENT),
		  EDU_HOLE_VALUE_Q);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_writeb(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	writel(0x11223344, base + EDU_REG_LIVE);
	writeb(0xaa, base + EDU_REG_LIVE);	/* ignored by edu */
	edu_check(ex, "readl live", readl(base + EDU_REG_LIVE), 0xeeddccbb);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_writew(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	writel(0x11223344, base + EDU_REG_LIVE);
	writew(0xbbbb, base + EDU_REG_LIVE);	/* ignored by edu */
	edu_check(ex, "readl live", readl(base + EDU_REG_LIVE), 0xeeddccbb);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_writel(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	writel(0x12345678, base + EDU_REG_LIVE);
	edu_check(ex, "readl live", readl(base + EDU_REG_LIVE), 0xedcba987);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_writeq(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	writeq(0xfedcba9876543210ULL, base + EDU_REG_DMA_DST);
	edu_check(ex, "readq dma dst", readq(base + EDU_REG_DMA_DST),
		  0xfedcba9876543210ULL);
	edu_check(ex, "readl dma dst", readl(base + EDU_REG_DMA_DST),
		  0x76543210);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_ioread8(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	edu_check(ex, "ioread8 ident", ioread8(base + EDU_REG_IDENT),
		  EDU_NARROW_READ_B);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_ioread16(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	edu_check(ex, "ioread16 ident", ioread16(base + EDU_REG_IDENT),
		  EDU_NARROW_READ_W);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_ioread32(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	edu_check(ex, "ioread32 ident", ioread32(base + EDU_REG_IDENT),
		  EDU_IDENT_VALUE);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_iowrite8(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	iowrite32(0x01020304, base + EDU_REG_LIVE);
	iowrite8(0x55, base + EDU_REG_LIVE);	/* ignored by edu */
	edu_check(ex, "ioread32 live", ioread32(base + EDU_REG_LIVE),
		  0xfefdfcfb);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_iowrite16(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	iowrite32(0x01020304, base + EDU_REG_LIVE);
	iowrite16(0x5555, base + EDU_REG_LIVE);	/* ignored by edu */
	edu_check(ex, "ioread32 live", ioread32(base + EDU_REG_LIVE),
		  0xfefdfcfb);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_iowrite32(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	iowrite32(0xa5a5a5a5, base + EDU_REG_LIVE);
	edu_check(ex, "ioread32 live", ioread32(base + EDU_REG_LIVE),
		  0x5a5a5a5a);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_imm(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	edu_store_imm(base + EDU_REG_LIVE);
	edu_check(ex, "readl live", readl(base + EDU_REG_LIVE),
		  (u32)~EDU_IMM_VALUE);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static const u8 edu_fromio_want[16] = {
	0x88, 0x77, 0x66, 0x55, 0xff, 0xff, 0xff, 0xff,
	0x00, 0xff, 0xee, 0xdd, 0xff, 0xff, 0xff, 0xff,
};

static int sc_toio(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base;
	u8 buf[16];
	int i;

	for (i = 0; i < sizeof(buf); i++)
		buf[i] = i;
	base = edu_map(ex);
	if (!base)
		return -ENOMEM;
	writeq(0, base + EDU_REG_DMA_SRC);
	writeq(0, base + EDU_REG_DMA_DST);
	/* rep movsl: four 4-byte stores at 0x80, 0x84 (hole), 0x88, 0x8c */
	memcpy_toio(base + EDU_REG_DMA_SRC, buf, sizeof(buf));
	edu_check(ex, "readq dma src", readq(base + EDU_REG_DMA_SRC),
		  0x03020100);
	edu_check(ex, "readq dma dst", readq(base + EDU_REG_DMA_DST),
		  0x0b0a0908);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_fromio(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);
	u8 buf[16];
	int i;

	if (!base)
		return -ENOMEM;
	writeq(0x1122334455667788ULL, base + EDU_REG_DMA_SRC);
	writeq(0x99aabbccddeeff00ULL, base + EDU_REG_DMA_DST);
	/* rep movsl: four 4-byte loads at 0x80, 0x84 (hole), 0x88, 0x8c */
	memcpy_fromio(buf, base + EDU_REG_DMA_SRC, sizeof(buf));
	edu_unmap(ex, base);
	for (i = 0; i < sizeof(buf); i++)
		edu_check(ex, "memcpy_fromio byte", buf[i], edu_fromio_want[i]);
	return edu_result(ex);
}

static int sc_memset(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);
	u64 v;

	if (!base)
		return -ENOMEM;

	writeq(0, base + EDU_REG_DMA_SRC);
	/*
	 * memset() is rep stosb where the kernel picks it (6.1 with ERMS):
	 * eight 1-byte stores, all ignored by edu.  Else it stores 8 bytes at
	 * once (movq, rep stosq: 6.12 without FSRS), which edu keeps.  Which
	 * one ran shows in the value read back, and in "memset_bytes".
	 */
	memset_io(base + EDU_REG_DMA_SRC, 0xa5, 8);
	v = readq(base + EDU_REG_DMA_SRC);
	if (v != 0xa5a5a5a5a5a5a5a5ULL)
		edu_check(ex, "readq dma src", v, 0);
	ex->memset_bytes = v == 0;
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_rmw(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);
	u32 v;

	if (!base)
		return -ENOMEM;
	writel(0x0000ff00, base + EDU_REG_LIVE);
	v = readl(base + EDU_REG_LIVE);
	edu_check(ex, "readl live", v, 0xffff00ff);
	v = (v & ~0xfU) | 0x5;
	writel(v, base + EDU_REG_LIVE);
	edu_check(ex, "readl live", readl(base + EDU_REG_LIVE), 0x0000ff0a);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_subpage(struct edu_ex *ex, unsigned int count)
{
	void __iomem *p;

	/* Only the page at BAR0 + 0x1000 (no registers there). */
	p = ioremap(ex->start + EDU_SPARE_PAGE, PAGE_SIZE);
	if (!p)
		return -ENOMEM;
	edu_check(ex, "readl spare page", readl(p), EDU_HOLE_VALUE);
	edu_check(ex, "readl spare page end", readl(p + PAGE_SIZE - 4),
		  EDU_HOLE_VALUE);
	iounmap(p);
	return edu_result(ex);
}

static int sc_unaligned(struct edu_ex *ex, unsigned int count)
{
	void __iomem *p;

	/*
	 * A mapping that starts inside a page: BAR0 + 0x80, one page long,
	 * so it ends in the next page (phys 0x80..0x107f).
	 */
	p = ioremap(ex->start + EDU_REG_DMA_SRC, PAGE_SIZE);
	if (!p)
		return -ENOMEM;
	writel(0x13579bdf, p);
	edu_check(ex, "readl dma src", readl(p), 0x13579bdf);
	writel(0x2468ace0, p + 8);
	edu_check(ex, "readq dma dst", readq(p + 8), 0x2468ace0);
	edu_check(ex, "readl spare page",
		  readl(p + EDU_SPARE_PAGE - EDU_REG_DMA_SRC), EDU_HOLE_VALUE);
	iounmap(p);
	return edu_result(ex);
}

static int sc_unknown(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	writel(0x0000000f, base + EDU_REG_LIVE);	/* live: 0xfffffff0 */
	edu_or_live(base);			/* writes 0xfffffff1 */
	edu_check(ex, "readl live", readl(base + EDU_REG_LIVE), 0x0000000e);
	edu_check(ex, "xchg live", edu_xchg_live(base, EDU_XCHG_VALUE),
		  0x0000000e);
	edu_check(ex, "test ident", edu_test_ident(base), true);
	edu_check(ex, "readl live", readl(base + EDU_REG_LIVE),
		  (u32)~EDU_XCHG_VALUE);
	edu_unmap(ex, base);
	return edu_result(ex);
}

static int sc_rloop(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);
	unsigned int i;
	int ret = 0;

	if (!base)
		return -ENOMEM;
	for (i = 0; i < count && !ret; i++) {
		edu_check(ex, "readl ident", readl(base + EDU_REG_IDENT),
			  EDU_IDENT_VALUE);
		ret = edu_loop_point(i);
	}
	edu_unmap(ex, base);
	return ret ? ret : edu_result(ex);
}

static int sc_wloop(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);
	unsigned int i;
	int ret = 0;

	if (!base)
		return -ENOMEM;
	for (i = 0; i < count && !ret; i++) {
		writel(i, base + EDU_REG_LIVE);
		ret = edu_loop_point(i);
	}
	edu_unmap(ex, base);
	return ret;
}

static int sc_wval(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);

	if (!base)
		return -ENOMEM;
	writel(count, base + EDU_REG_DMA_SRC);
	edu_unmap(ex, base);
	return 0;
}

static int sc_cloop(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base;
	unsigned int i;
	u8 *buf;

	if (count > ex->len - EDU_SPARE_PAGE)
		return -EINVAL;
	buf = kvmalloc(max(count, 1U), GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	for (i = 0; i < count; i++)
		buf[i] = i;
	base = edu_map(ex);
	if (!base) {
		kvfree(buf);
		return -ENOMEM;
	}
	memcpy_toio(base + EDU_SPARE_PAGE, buf, count);
	edu_unmap(ex, base);
	kvfree(buf);
	return 0;
}

struct edu_burst;

struct edu_burst_thread {
	struct edu_burst *burst;
	struct task_struct *task;
	struct completion done;
	u64 bad;
	int cpu;
};

struct edu_burst {
	void __iomem *base;
	phys_addr_t phys;	/* maps: each round maps page 0 of BAR0 anew */
	bool maps;
	unsigned int count;
	struct completion start;
	struct edu_burst_thread t[2];
};

static int edu_burst_fn(void *data)
{
	struct edu_burst_thread *t = data;
	struct edu_burst *b = t->burst;
	unsigned int i;

	wait_for_completion(&b->start);
	t->cpu = raw_smp_processor_id();
	for (i = 0; i < b->count; i++) {
		void __iomem *p = b->maps ? ioremap(b->phys, PAGE_SIZE) : b->base;

		if (!p || readl(p + EDU_REG_IDENT) != EDU_IDENT_VALUE)
			t->bad++;
		if (p && b->maps)
			iounmap(p);
		if ((i & 1023) == 1023 || b->maps)
			cond_resched();
	}
	complete(&t->done);
	return 0;
}

static int edu_burst_run(struct edu_ex *ex, unsigned int count, bool maps);

static int sc_burst(struct edu_ex *ex, unsigned int count)
{
	return edu_burst_run(ex, count, false);
}

/* COUNT x (ioremap page 0; readl; iounmap) on each of two CPUs at once */
static int st_maploop2(struct edu_ex *ex, unsigned int count)
{
	return edu_burst_run(ex, count, true);
}

static int edu_burst_run(struct edu_ex *ex, unsigned int count, bool maps)
{
	struct edu_burst *b;
	unsigned int cpu[2];
	int ret = 0;
	int i, made;

	b = kzalloc(sizeof(*b), GFP_KERNEL);
	if (!b)
		return -ENOMEM;
	b->count = count;
	b->maps = maps;
	b->phys = ex->start;
	init_completion(&b->start);
	b->base = edu_map(ex);
	if (!b->base) {
		kfree(b);
		return -ENOMEM;
	}

	for (made = 0; made < 2; made++) {
		struct edu_burst_thread *t = &b->t[made];
		struct task_struct *task;

		t->burst = b;
		init_completion(&t->done);
		task = kthread_create(edu_burst_fn, t, "edu_burst/%d", made);
		if (IS_ERR(task)) {
			ret = PTR_ERR(task);
			break;
		}
		get_task_struct(task);
		t->task = task;
	}
	if (!ret) {
		/*
		 * Bind to the first two online CPUs (the same one twice if it
		 * is alone, as under the kernel's mmiotrace) and keep them
		 * online until both threads are done.
		 */
		cpus_read_lock();
		cpu[0] = cpumask_first(cpu_online_mask);
		cpu[1] = cpumask_next(cpu[0], cpu_online_mask);
		if (cpu[1] >= nr_cpu_ids)
			cpu[1] = cpu[0];
		for (i = 0; i < 2; i++) {
			kthread_bind(b->t[i].task, cpu[i]);
			wake_up_process(b->t[i].task);
		}
		complete_all(&b->start);
		for (i = 0; i < 2; i++)
			wait_for_completion(&b->t[i].done);
		cpus_read_unlock();
	}
	/* A thread that was never woken exits here without running. */
	for (i = 0; i < made; i++) {
		int tret = kthread_stop(b->t[i].task);

		if (!ret && tret)
			ret = tret;
		put_task_struct(b->t[i].task);
	}

	edu_unmap(ex, b->base);
	if (!ret) {
		ex->burst_cpu[0] = b->t[0].cpu;
		ex->burst_cpu[1] = b->t[1].cpu;
		ex->mismatches = b->t[0].bad + b->t[1].bad;
		if (ex->mismatches) {
			pr_err("burst: %llu wrong ident values\n",
			       ex->mismatches);
			ret = -EIO;
		}
	}
	kfree(b);
	return ret;
}

/* ---- stress scenarios (the "stress" file) ---------------------------- */

/*
 * One mapping of the whole BAR0, then COUNT rounds of one readl per page:
 * page 0 at offset 0 reads the ident, the other pages all ones.  The
 * mapping's address is in stride_virt while it exists.
 */
static int st_stride(struct edu_ex *ex, unsigned int count)
{
	unsigned long npages = ex->len >> PAGE_SHIFT;
	void __iomem *base = edu_map(ex);
	unsigned int r;
	unsigned long p;
	int ret = 0;

	if (!base)
		return -ENOMEM;
	WRITE_ONCE(ex->stride_virt, (unsigned long)base);
	for (r = 0; r < count; r++) {
		/*
		 * Forget the cached translations, as a context switch or a
		 * TLB shootdown would: every page is walked again.
		 */
		if (READ_ONCE(ex->stride_flush)) {
			preempt_disable();
			ng_flush_tlb_local();
			preempt_enable();
		}
		for (p = 0; p < npages; p++)
			edu_check(ex, "stride readl",
				  readl(base + p * PAGE_SIZE),
				  p ? EDU_HOLE_VALUE : EDU_IDENT_VALUE);
		cond_resched();
		if (fatal_signal_pending(current)) {
			ret = -EINTR;
			break;
		}
	}
	WRITE_ONCE(ex->stride_virt, 0);
	edu_unmap(ex, base);
	return ret ? ret : edu_result(ex);
}

/*
 * COUNT times: ioremap the first page of BAR0, wait maploop_hold_us, readl
 * the ident, iounmap.  The mapping's address is in maploop_virt from
 * before its first use until after its iounmap.
 */
static int st_maploop(struct edu_ex *ex, unsigned int count)
{
	unsigned int i;
	void __iomem *p;
	u32 hold;

	for (i = 0; i < count; i++) {
		p = ioremap(ex->start, PAGE_SIZE);
		if (!p)
			return -ENOMEM;
		WRITE_ONCE(ex->maploop_virt, (unsigned long)p);
		hold = READ_ONCE(ex->maploop_hold_us);
		if (hold)
			usleep_range(hold, hold + hold / 4 + 1);
		edu_check(ex, "maploop readl ident", readl(p + EDU_REG_IDENT),
			  EDU_IDENT_VALUE);
		iounmap(p);
		WRITE_ONCE(ex->maploop_virt, 0);
		if (hold || (i & 63) == 63) {
			cond_resched();
			if (fatal_signal_pending(current))
				return -EINTR;
		}
	}
	return edu_result(ex);
}

/* "kprobe_read": an MMIO read made from inside a kprobe pre-handler. */
static u32 edu_kprobe_value;

static noinline void edu_kprobe_target(void __iomem *base)
{
	/* a side effect gcc cannot see through: the call stays */
	asm volatile("" : : "r" (base) : "memory");
}

static int edu_kprobe_pre(struct kprobe *kp, struct pt_regs *regs)
{
	void __iomem *base;

	base = (void __iomem *)regs_get_kernel_argument(regs, 0);
	WRITE_ONCE(edu_kprobe_value, readl(base + EDU_REG_IDENT));
	return 0;
}

static int st_kprobe_read(struct edu_ex *ex, unsigned int count)
{
	struct kprobe kp = {
		.addr = (kprobe_opcode_t *)edu_kprobe_target,
		.pre_handler = edu_kprobe_pre,
	};
	void __iomem *base = edu_map(ex);
	int ret;

	if (!base)
		return -ENOMEM;
	WRITE_ONCE(edu_kprobe_value, 0);
	ret = register_kprobe(&kp);
	if (!ret) {
		edu_kprobe_target(base);
		unregister_kprobe(&kp);
		edu_check(ex, "readl ident in a kprobe handler",
			  READ_ONCE(edu_kprobe_value), EDU_IDENT_VALUE);
	}
	edu_unmap(ex, base);
	return ret ? ret : edu_result(ex);
}

/*
 * A 16-byte window of BAR0 (the DMA source and destination registers at
 * 0x80, 0x88), mapped on its own, as a driver maps a small BAR:
 * writeq/readq 0x80, writel/readl 0x88.
 */
static int st_window16(struct edu_ex *ex, unsigned int count)
{
	void __iomem *p = ioremap(ex->start + EDU_REG_DMA_SRC, 16);

	if (!p)
		return -ENOMEM;
	writeq(0x0123456789abcdefULL, p);
	edu_check(ex, "readq window", readq(p), 0x0123456789abcdefULL);
	writel(0x5a5aa5a5, p + 8);
	edu_check(ex, "readl window", readl(p + 8), 0x5a5aa5a5);
	iounmap(p);
	return edu_result(ex);
}

/*
 * A mapping of BAR0's last page and the page after it: it only partly
 * covers the BAR, so a tracer of BAR0 cannot trace it (and must say so).
 * One readl inside the BAR.
 */
static int st_straddle(struct edu_ex *ex, unsigned int count)
{
	void __iomem *p = ioremap(ex->start + ex->len - PAGE_SIZE, 2 * PAGE_SIZE);

	if (!p)
		return -ENOMEM;
	edu_check(ex, "readl last page", readl(p), EDU_HOLE_VALUE);
	iounmap(p);
	return edu_result(ex);
}

/*
 * One movsl from the ident register to 0xffe, where the destination
 * crosses into the second page of the same mapping: the element must be
 * read from the device once (the write cannot go through one window).
 * The 4 bytes at 0xffe..0x1001 are no registers: the write changes nothing.
 */
static int st_movs_cross(struct edu_ex *ex, unsigned int count)
{
	void __iomem *p = ioremap(ex->start, 2 * PAGE_SIZE);
	void __iomem *src, *dst;
	unsigned long n = 1;

	if (!p)
		return -ENOMEM;
	src = p + EDU_REG_IDENT;
	dst = p + PAGE_SIZE - 2;
	asm volatile("rep movsl"
		     : "+S" (src), "+D" (dst), "+c" (n) : : "memory");
	iounmap(p);
	return n ? -EIO : 0;
}

/*
 * A write-combining mapping of BAR0's first page, kept for COUNT rounds of
 * writel i / readl 0x04 with a millisecond or two between them, so that a test
 * can look at the memory type the kernel gave it while it lives.
 */
static int st_wc_loop(struct edu_ex *ex, unsigned int count)
{
	void __iomem *p = ioremap_wc(ex->start, PAGE_SIZE);
	unsigned int i;
	int ret = 0;

	if (!p)
		return -ENOMEM;
	WRITE_ONCE(ex->wc_virt, (unsigned long)p);
	for (i = 0; i < count && !ret; i++) {
		writel(i, p + EDU_REG_LIVE);
		edu_check(ex, "readl live (wc)", readl(p + EDU_REG_LIVE), ~i);
		usleep_range(1000, 2000);
		if (fatal_signal_pending(current))
			ret = -EINTR;
	}
	WRITE_ONCE(ex->wc_virt, 0);
	iounmap(p);
	return ret ? ret : edu_result(ex);
}

/*
 * One writel of 0x04 and one readl of it, each one instruction whose address
 * is taken with a label (as readl()/writel() would make them: movl to and
 * from memory), kept in pc_write and pc_read for the test of --pc.
 */
static int st_pc(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);
	unsigned long ip;
	u32 v = 0x5a5a0001;

	if (!base)
		return -ENOMEM;
	asm volatile("1: movl %2, %0\n\tleaq 1b(%%rip), %1"
		     : "=m" (*(volatile u32 __force *)(base + EDU_REG_LIVE)), "=r" (ip)
		     : "r" (v) : "memory");
	ex->pc_write = ip;
	asm volatile("1: movl %2, %0\n\tleaq 1b(%%rip), %1"
		     : "=r" (v), "=r" (ip)
		     : "m" (*(volatile u32 __force *)(base + EDU_REG_LIVE)) : "memory");
	ex->pc_read = ip;
	edu_check(ex, "readl live (pc)", v, ~0x5a5a0001U);
	edu_unmap(ex, base);
	return edu_result(ex);
}

/*
 * "fact": the factorial of COUNT, computed by edu: writel COUNT to 0x08, poll
 * the status register (0x20) until its bit 0 (computing) clears, readl 0x08.
 * edu computes it in a thread of its own, one 32-bit multiplication per
 * number down from COUNT, so a large COUNT (2^26: tens of milliseconds) keeps
 * it busy long enough for the poll to see it busy.  The result is checked
 * against the product modulo 2^32 made here (0 from 34 on: 34! has 32 twos);
 * the status is read every 200-400 us, for 5 s at most (-ETIMEDOUT).
 */
static int st_fact(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);
	unsigned long deadline = jiffies + 5 * HZ;
	u32 want = 1, n;
	int ret = 0;

	if (!base)
		return -ENOMEM;
	for (n = count; n > 1 && want; n--)
		want *= n;
	writel(count, base + EDU_REG_FACT);
	while (readl(base + EDU_REG_STATUS) & EDU_STATUS_COMPUTING) {
		if (time_after(jiffies, deadline)) {
			ret = -ETIMEDOUT;
			break;
		}
		usleep_range(200, 400);
	}
	if (!ret)
		edu_check(ex, "readl fact", readl(base + EDU_REG_FACT), want);
	edu_unmap(ex, base);
	return ret ? ret : edu_result(ex);
}

/*
 * An ioremap of memory that is no PCI device's: the HPET's registers at
 * their usual place (QEMU's pc machine has them there), a readl of its
 * capabilities (nonzero: vendor, counter size, timers) kept in
 * nonpci_value, iounmap.
 */
#define EDU_HPET_BASE	0xfed00000UL

static int st_nonpci(struct edu_ex *ex, unsigned int count)
{
	void __iomem *p = ioremap(EDU_HPET_BASE, 1024);

	if (!p)
		return -ENOMEM;
	ex->nonpci_value = readl(p);
	iounmap(p);
	return ex->nonpci_value ? 0 : -EIO;
}

/*
 * A kernel variable for the hardware-breakpoint tracer (mmiotrace-ng ksym):
 * written COUNT times from edu_watch_writer, read COUNT times from
 * edu_watch_reader, touched nowhere else.
 */
static u32 edu_watched;
static u32 edu_watch_sink;

static noinline void edu_watch_writer(unsigned int count)
{
	unsigned int i;

	for (i = 0; i < count; i++)
		WRITE_ONCE(edu_watched, i + 1);
}

static noinline u32 edu_watch_reader(unsigned int count)
{
	unsigned int i;
	u32 sum = 0;

	for (i = 0; i < count; i++)
		sum += READ_ONCE(edu_watched);
	return sum;
}

static int st_watch_write(struct edu_ex *ex, unsigned int count)
{
	edu_watch_writer(count);
	return 0;
}

static int st_watch_read(struct edu_ex *ex, unsigned int count)
{
	WRITE_ONCE(edu_watch_sink, edu_watch_reader(count));
	return 0;
}

/*
 * Accesses across the boundary of BAR0's first two pages: readl and writel
 * at 0xffe, readq at 0xffc.  The values read go to the kernel log, for the
 * test to compare with the trace's.
 */
static int st_pagecross(struct edu_ex *ex, unsigned int count)
{
	void __iomem *base = edu_map(ex);
	u64 q;
	u32 l;

	if (!base)
		return -ENOMEM;
	l = readl(base + 0xffe);
	writel(0x5a5a5a5a, base + 0xffe);
	q = readq(base + 0xffc);
	edu_unmap(ex, base);
	pr_info("pagecross: readl 0x%x readq 0x%llx\n", l, q);
	return 0;
}

/*
 * "nmi": MMIO from an NMI handler while the same CPU traces its own
 * accesses.  A kernel thread on the first online CPU runs COUNT rounds of
 * maploop (ioremap page 0 of BAR0, readl ident, iounmap); meanwhile a
 * thread on the next CPU sends it NMIs, one at a time (the next only after
 * the handler ran), a fraction of a millisecond apart.  The handler reads
 * the status register (0x20) through a mapping of BAR0 made before, and
 * every second time also the irq status register (0x24), or with
 * nmi_unknown set tests the ident register with a testl (an instruction
 * a tracer's decoder may not know).
 */
struct edu_nmi {
	struct edu_ex *ex;
	void __iomem *base;
	int cpu;		/* the CPU the NMIs go to */
	u32 sent;		/* NMIs sent ... */
	u32 done;		/* ... and handled */
	u32 second;		/* second reads */
	bool unknown;		/* the second access is a testl of 0x00 */
	u32 bad;		/* wrong status values */
	struct completion loop_done, send_done;
	unsigned int count;
	int loop_ret, send_ret;
};

static struct edu_nmi *edu_nmi_run;	/* set while an "nmi" run lasts */

static int edu_nmi_handler(unsigned int type, struct pt_regs *regs)
{
	struct edu_nmi *n = READ_ONCE(edu_nmi_run);

	if (!n || raw_smp_processor_id() != n->cpu ||
	    READ_ONCE(n->done) == READ_ONCE(n->sent))
		return NMI_DONE;
	if (readl(n->base + EDU_REG_STATUS) != 0)
		n->bad++;
	if (n->done & 1) {
		if (!n->unknown && readl(n->base + EDU_REG_IRQ_STATUS) != 0)
			n->bad++;
		if (n->unknown && !edu_test_ident(n->base))
			n->bad++;
		n->second++;
	}
	/* pairs with the sender's acquire: this NMI's counts are seen first */
	smp_store_release(&n->done, n->done + 1);
	return NMI_HANDLED;
}

static int edu_nmi_loop_fn(void *data)
{
	struct edu_nmi *n = data;
	unsigned int i;
	void __iomem *p;

	for (i = 0; i < n->count && !n->loop_ret; i++) {
		p = ioremap(n->ex->start, PAGE_SIZE);
		if (!p) {
			n->loop_ret = -ENOMEM;
			break;
		}
		edu_check(n->ex, "nmi loop readl ident", readl(p + EDU_REG_IDENT),
			  EDU_IDENT_VALUE);
		iounmap(p);
		if ((i & 63) == 63)
			cond_resched();
	}
	complete_all(&n->loop_done);	/* stays done: the sender polls it */
	return 0;
}

/* Send NMIs to n->cpu until its loop is done; -ETIMEDOUT if one is lost. */
static int edu_nmi_send(struct edu_nmi *n)
{
	unsigned long deadline;

	while (!completion_done(&n->loop_done)) {
		WRITE_ONCE(n->sent, n->sent + 1);
		apic->send_IPI(n->cpu, NMI_VECTOR);
		deadline = jiffies + HZ;
		/* pairs with the handler's release: its counts come with it */
		while (smp_load_acquire(&n->done) != n->sent) {
			if (time_after(jiffies, deadline))
				return -ETIMEDOUT;
			cpu_relax();
		}
		/* about one NMI per round of the loop, at varying points */
		usleep_range(100 + (n->sent % 7) * 100, 1000);
	}
	return 0;
}

static int edu_nmi_send_fn(void *data)
{
	struct edu_nmi *n = data;

	n->send_ret = edu_nmi_send(n);
	if (n->send_ret)
		n->loop_ret = n->send_ret;	/* the loop stops at its next round */
	complete(&n->send_done);
	return 0;
}

static int st_nmi(struct edu_ex *ex, unsigned int count)
{
	struct task_struct *loop, *send;
	struct edu_nmi *n;
	int ret, sender;

	n = kzalloc(sizeof(*n), GFP_KERNEL);
	if (!n)
		return -ENOMEM;
	n->ex = ex;
	n->count = count;
	n->unknown = READ_ONCE(ex->nmi_unknown);
	init_completion(&n->loop_done);
	init_completion(&n->send_done);
	n->base = edu_map(ex);
	if (!n->base) {
		kfree(n);
		return -ENOMEM;
	}
	ret = register_nmi_handler(NMI_LOCAL, edu_nmi_handler, 0, KBUILD_MODNAME);
	if (ret)
		goto out_unmap;
	loop = kthread_create(edu_nmi_loop_fn, n, "edu_nmi_loop");
	if (IS_ERR(loop)) {
		ret = PTR_ERR(loop);
		goto out_handler;
	}
	get_task_struct(loop);
	send = kthread_create(edu_nmi_send_fn, n, "edu_nmi_send");
	if (IS_ERR(send)) {
		ret = PTR_ERR(send);
		/* never woken: it exits without running */
		kthread_stop(loop);
		put_task_struct(loop);
		goto out_handler;
	}
	get_task_struct(send);
	cpus_read_lock();
	n->cpu = cpumask_first(cpu_online_mask);
	sender = cpumask_next(n->cpu, cpu_online_mask);
	if (sender >= nr_cpu_ids)
		sender = n->cpu;
	kthread_bind(loop, n->cpu);
	kthread_bind(send, sender);
	WRITE_ONCE(edu_nmi_run, n);
	wake_up_process(loop);
	wake_up_process(send);
	wait_for_completion(&n->loop_done);
	wait_for_completion(&n->send_done);
	cpus_read_unlock();
	WRITE_ONCE(edu_nmi_run, NULL);
	/* both have left their functions (module text) when these return */
	kthread_stop(loop);
	kthread_stop(send);
	put_task_struct(loop);
	put_task_struct(send);
	ret = n->send_ret ? n->send_ret : n->loop_ret;
out_handler:
	unregister_nmi_handler(NMI_LOCAL, KBUILD_MODNAME);
	ex->nmi_reads = n->done;
	ex->nmi_second = n->second;
	if (n->bad) {
		pr_err("nmi: %u wrong status values\n", n->bad);
		ex->errors++;
	}
out_unmap:
	edu_unmap(ex, n->base);
	kfree(n);
	return ret ? ret : edu_result(ex);
}

/*
 * "crossirq": a thread does COUNT readq of 0xffc (across BAR0's first two
 * pages), each in a 1 ms section with interrupts off, while a thread on
 * the next CPU reads the status register (0x20) in a loop until the first
 * is done, and counts its reads (crossirq_reads): a tracer that made the
 * two pages present for the readq would miss reads of the other CPU.
 */
struct edu_crossirq {
	void __iomem *base;
	unsigned int count;
	bool done;
	u32 reads;
	u32 bad;
	struct completion irqoff_done, hammer_done;
};

static int edu_crossirq_irqoff_fn(void *data)
{
	struct edu_crossirq *c = data;
	unsigned long flags;
	unsigned int i;

	for (i = 0; i < c->count; i++) {
		local_irq_save(flags);
		(void)readq(c->base + EDU_SPARE_PAGE - 4);
		mdelay(1);
		local_irq_restore(flags);
		cond_resched();
	}
	WRITE_ONCE(c->done, true);
	complete(&c->irqoff_done);
	return 0;
}

static int edu_crossirq_hammer_fn(void *data)
{
	struct edu_crossirq *c = data;

	while (!READ_ONCE(c->done)) {
		if (readl(c->base + EDU_REG_STATUS) != 0)
			c->bad++;
		if (!(++c->reads & 63))
			cond_resched();
	}
	complete(&c->hammer_done);
	return 0;
}

static int st_crossirq(struct edu_ex *ex, unsigned int count)
{
	struct task_struct *irqoff, *hammer;
	struct edu_crossirq *c;
	int ret = 0, cpu, other;

	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return -ENOMEM;
	c->count = count;
	init_completion(&c->irqoff_done);
	init_completion(&c->hammer_done);
	c->base = edu_map(ex);
	if (!c->base) {
		kfree(c);
		return -ENOMEM;
	}
	irqoff = kthread_create(edu_crossirq_irqoff_fn, c, "edu_cross_irqoff");
	if (IS_ERR(irqoff)) {
		ret = PTR_ERR(irqoff);
		goto out;
	}
	get_task_struct(irqoff);
	hammer = kthread_create(edu_crossirq_hammer_fn, c, "edu_cross_hammer");
	if (IS_ERR(hammer)) {
		ret = PTR_ERR(hammer);
		/* never woken: it exits without running */
		kthread_stop(irqoff);
		put_task_struct(irqoff);
		goto out;
	}
	get_task_struct(hammer);
	cpus_read_lock();
	cpu = cpumask_first(cpu_online_mask);
	other = cpumask_next(cpu, cpu_online_mask);
	if (other >= nr_cpu_ids)
		other = cpu;
	kthread_bind(irqoff, cpu);
	kthread_bind(hammer, other);
	wake_up_process(irqoff);
	wake_up_process(hammer);
	wait_for_completion(&c->irqoff_done);
	wait_for_completion(&c->hammer_done);
	cpus_read_unlock();
	kthread_stop(irqoff);
	kthread_stop(hammer);
	put_task_struct(irqoff);
	put_task_struct(hammer);
	ex->crossirq_reads = c->reads;
	if (c->bad) {
		pr_err("crossirq: %u wrong status values\n", c->bad);
		ex->errors++;
	}
out:
	edu_unmap(ex, c->base);
	kfree(c);
	return ret ? ret : edu_result(ex);
}

#ifndef PCI_IRQ_INTX
#define PCI_IRQ_INTX	PCI_IRQ_LEGACY
#endif

/*
 * The handler of "irq_intx"/"irq_msi": reads the interrupt status and acks
 * what it read.  The line may be shared (INTx): a zero status is not ours.
 */
static irqreturn_t edu_irq_handler(int irq, void *data)
{
	struct edu_ex *ex = data;
	u32 status;

	status = readl(ex->irq_base + EDU_REG_IRQ_STATUS);
	if (!status)
		return IRQ_NONE;
	writel(status, ex->irq_base + EDU_REG_IRQ_ACK);
	ex->irq_handled++;
	complete(&ex->irq_done);
	return IRQ_HANDLED;
}

static int st_irq_here(struct edu_ex *ex, unsigned int count,
		       unsigned int type)
{
	struct pci_dev *pdev = ex->pdev;
	unsigned int i;
	int irq, ret;

	ex->irq_handled = 0;
	ex->irq_vector = 0;
	ex->irq_base = edu_map(ex);
	if (!ex->irq_base)
		return -ENOMEM;
	ret = pci_alloc_irq_vectors(pdev, 1, 1, type);
	if (ret < 0)
		goto out_unmap;
	irq = pci_irq_vector(pdev, 0);
	if (irq < 0) {
		ret = irq;
		goto out_free;
	}
	ex->irq_vector = irq;
	init_completion(&ex->irq_done);
	ret = request_irq(irq, edu_irq_handler, IRQF_SHARED, KBUILD_MODNAME, ex);
	if (ret)
		goto out_free;
	ret = irq_set_affinity(irq, cpumask_of(smp_processor_id()));
	if (ret)
		goto out_irq;
	pci_set_master(pdev);
	for (i = 0; i < count && !ret; i++) {
		reinit_completion(&ex->irq_done);
		writel(1, ex->irq_base + EDU_REG_IRQ_RAISE);
		if (!wait_for_completion_timeout(&ex->irq_done, HZ)) {
			pr_err("irq %d: no interrupt within a second (%u of %u)\n",
			       irq, i, count);
			ret = -ETIMEDOUT;
		}
		if (!ret)
			ret = edu_loop_point(i);
	}
	pci_clear_master(pdev);
out_irq:
	free_irq(irq, ex);
out_free:
	pci_free_irq_vectors(pdev);
out_unmap:
	edu_unmap(ex, ex->irq_base);
	ex->irq_base = NULL;
	return ret ? ret : edu_result(ex);
}

/*
 * "irq_intx"/"irq_msi": one vector of that kind, a handler on it, and COUNT
 * times: write 1 to the raise register, wait for the handler (1 s at most).
 * The interrupt goes to the CPU the writes are made on: it comes after
 * the write there, so a tracer's records of the two are in that order.
 */
static int st_irq(struct edu_ex *ex, unsigned int count, unsigned int type)
{
	int ret;

	migrate_disable();
	ret = st_irq_here(ex, count, type);
	migrate_enable();
	return ret;
}

static int st_irq_intx(struct edu_ex *ex, unsigned int count)
{
	return st_irq(ex, count, PCI_IRQ_INTX);
}

static int st_irq_msi(struct edu_ex *ex, unsigned int count)
{
	return st_irq(ex, count, PCI_IRQ_MSI);
}

/* One edu DMA of len bytes between addr and edu's buffer; 0 when done. */
static int edu_dma_run(void __iomem *base, dma_addr_t addr, u32 len, u32 cmd)
{
	unsigned int waited;

	if (cmd & EDU_DMA_FROM_EDU) {
		writeq(EDU_DMA_BUF, base + EDU_REG_DMA_SRC);
		writeq(addr, base + EDU_REG_DMA_DST);
	} else {
		writeq(addr, base + EDU_REG_DMA_SRC);
		writeq(EDU_DMA_BUF, base + EDU_REG_DMA_DST);
	}
	writeq(len, base + EDU_REG_DMA_COUNT);
	writeq(cmd | EDU_DMA_RUN, base + EDU_REG_DMA_CMD);
	/* edu finishes a transfer 100 ms (QEMU's virtual clock) after */
	for (waited = 0; waited < 2000; waited++) {
		if (!(readq(base + EDU_REG_DMA_CMD) & EDU_DMA_RUN))
			return 0;
		usleep_range(1000, 2000);
	}
	return -ETIMEDOUT;
}

/*
 * "dma": a kmalloc'ed page mapped to the device (dma_map_single), its first
 * half sent to edu's buffer and written back from it into a coherent page
 * (dma_alloc_coherent); the two must then hold the same bytes.  Their bus addresses are kept in
 * dma_to and dma_from.
 */
static int st_dma(struct edu_ex *ex, unsigned int count)
{
	struct device *dev = &ex->pdev->dev;
	void __iomem *base;
	dma_addr_t to, from;
	u8 *out, *back;
	int ret, i;

	ret = dma_set_mask_and_coherent(dev, DMA_BIT_MASK(EDU_DMA_BITS));
	if (ret)
		return ret;
	base = edu_map(ex);
	if (!base)
		return -ENOMEM;
	ret = -ENOMEM;
	out = kmalloc(PAGE_SIZE, GFP_KERNEL | GFP_DMA);
	if (!out)
		goto out_unmap;
	for (i = 0; i < PAGE_SIZE; i++)
		out[i] = i * 7 + 1;
	back = dma_alloc_coherent(dev, PAGE_SIZE, &from, GFP_KERNEL);
	if (!back)
		goto out_free;
	to = dma_map_single(dev, out, PAGE_SIZE, DMA_TO_DEVICE);
	ret = dma_mapping_error(dev, to);
	if (ret)
		goto out_coherent;
	ex->dma_to = to;
	ex->dma_from = from;
	pci_set_master(ex->pdev);
	ret = edu_dma_run(base, to, EDU_DMA_LEN, 0);
	if (!ret)
		ret = edu_dma_run(base, from, EDU_DMA_LEN, EDU_DMA_FROM_EDU);
	pci_clear_master(ex->pdev);
	dma_unmap_single(dev, to, PAGE_SIZE, DMA_TO_DEVICE);
	if (!ret && memcmp(out, back, EDU_DMA_LEN)) {
		pr_err("dma: the page edu wrote back differs from the one sent\n");
		ex->errors++;
	}
out_coherent:
	dma_free_coherent(dev, PAGE_SIZE, back, from);
out_free:
	kfree(out);
out_unmap:
	edu_unmap(ex, base);
	return ret ? ret : edu_result(ex);
}

static const struct edu_scenario edu_stress[] = {
	{ "stride", st_stride, true,
	  "one BAR0 mapping; COUNT rounds of readl of every page" },
	{ "maploop", st_maploop, true,
	  "COUNT x (ioremap page 0; readl 0x00; iounmap)" },
	{ "maploop2", st_maploop2, true,
	  "maploop on each of two CPUs at once" },
	{ "kprobe_read", st_kprobe_read, false,
	  "readl 0x00 from a kprobe handler" },
	{ "window16", st_window16, false,
	  "ioremap of 0x80..0x8f only; writeq/readq 0x80, writel/readl 0x88" },
	{ "straddle", st_straddle, false,
	  "ioremap of BAR0's last page and the next; readl in the BAR" },
	{ "wc_loop", st_wc_loop, true,
	  "ioremap_wc of page 0; COUNT x (writel i, readl 0x04, 1 ms)" },
	{ "watch_write", st_watch_write, true,
	  "COUNT writes of edu_watched from edu_watch_writer (no MMIO)" },
	{ "watch_read", st_watch_read, true,
	  "COUNT reads of edu_watched from edu_watch_reader (no MMIO)" },
	{ "pagecross", st_pagecross, false,
	  "readl, writel at 0xffe and readq at 0xffc: across BAR0's first page" },
	{ "nmi", st_nmi, true,
	  "maploop COUNT on one CPU, NMIs to it reading 0x20 (and 0x24 or 0xffe)" },
	{ "crossirq", st_crossirq, true,
	  "COUNT readq of 0xffc, irqs off 1 ms each; the next CPU reads 0x20 meanwhile" },
	{ "movs_cross", st_movs_cross, false,
	  "one movsl from 0x00 to 0xffe (across the page) of a 2-page mapping" },
	{ "nonpci", st_nonpci, false,
	  "ioremap of the HPET (0xfed00000, no PCI device's), readl 0x00; value in nonpci_value" },
	{ "pc", st_pc, false,
	  "writel, readl 0x04; their instructions' addresses in pc_write, pc_read" },
	{ "fact", st_fact, true,
	  "writel COUNT to 0x08; poll 0x20 until idle; readl 0x08 (COUNT! mod 2^32)" },
	{ "irq_intx", st_irq_intx, true,
	  "COUNT x (writel 1 to 0x60; the INTx handler reads 0x24, writes it to 0x64)" },
	{ "irq_msi", st_irq_msi, true,
	  "COUNT x (writel 1 to 0x60; the MSI handler reads 0x24, writes it to 0x64)" },
	{ "dma", st_dma, false,
	  "half a mapped page DMAed to edu (0x80-0x98), back into a coherent page" },
};

static const struct edu_scenario edu_scenarios[] = {
	{ "readb", sc_readb, false, "readb of 0x00, 0x04, 0x80" },
	{ "readw", sc_readw, false, "readw of 0x00, 0x80" },
	{ "readl", sc_readl, false, "readl of 0x00, 0x20, 0x24, 0x40" },
	{ "readq", sc_readq, false, "writeq 0x80; readq 0x80, 0x00" },
	{ "writeb", sc_writeb, false, "writel 0x04; writeb 0x04; readl 0x04" },
	{ "writew", sc_writew, false, "writel 0x04; writew 0x04; readl 0x04" },
	{ "writel", sc_writel, false, "writel 0x04; readl 0x04" },
	{ "writeq", sc_writeq, false, "writeq 0x88; readq 0x88; readl 0x88" },
	{ "ioread8", sc_ioread8, false, "ioread8 of 0x00" },
	{ "ioread16", sc_ioread16, false, "ioread16 of 0x00" },
	{ "ioread32", sc_ioread32, false, "ioread32 of 0x00" },
	{ "iowrite8", sc_iowrite8, false,
	  "iowrite32 0x04; iowrite8 0x04; ioread32 0x04" },
	{ "iowrite16", sc_iowrite16, false,
	  "iowrite32 0x04; iowrite16 0x04; ioread32 0x04" },
	{ "iowrite32", sc_iowrite32, false, "iowrite32 0x04; ioread32 0x04" },
	{ "imm", sc_imm, false, "movl $imm32 to 0x04 (c7 /0); readl 0x04" },
	{ "toio", sc_toio, false, "memcpy_toio of 16 bytes to 0x80" },
	{ "fromio", sc_fromio, false, "memcpy_fromio of 16 bytes from 0x80" },
	{ "memset", sc_memset, false, "memset_io of 8 bytes at 0x80" },
	{ "rmw", sc_rmw, false, "writel; readl; writel (bits changed); readl" },
	{ "subpage", sc_subpage, false,
	  "ioremap of the page at 0x1000 only; readl 0x1000, 0x1ffc" },
	{ "unaligned", sc_unaligned, false,
	  "ioremap of 0x80..0x107f; access 0x80, 0x88, 0x1000" },
	{ "unknown", sc_unknown, false, "orl, xchg and testl on MMIO" },
	{ "rloop", sc_rloop, true, "COUNT readl of 0x00" },
	{ "wloop", sc_wloop, true, "COUNT writel of 0..COUNT-1 to 0x04" },
	{ "wval", sc_wval, true, "writel of COUNT to 0x80 (one write)" },
	{ "cloop", sc_cloop, true, "memcpy_toio of COUNT bytes to 0x1000" },
	{ "burst", sc_burst, true,
	  "COUNT readl of 0x00 on each of two CPUs at once" },
};

struct edu_table {
	const struct edu_scenario *sc;
	unsigned int n;
};

static const struct edu_table edu_run_table = {
	edu_scenarios, ARRAY_SIZE(edu_scenarios)
};

static const struct edu_table edu_stress_table = {
	edu_stress, ARRAY_SIZE(edu_stress)
};

static const struct edu_scenario *edu_find(const struct edu_table *t,
					   const char *name)
{
	unsigned int i;

	for (i = 0; i < t->n; i++)
		if (!strcmp(t->sc[i].name, name))
			return &t->sc[i];
	return NULL;
}

static void edu_list(struct seq_file *m, const struct edu_table *t)
{
	unsigned int i;

	for (i = 0; i < t->n; i++) {
		const struct edu_scenario *sc = &t->sc[i];

		seq_printf(m, "%s%s\t%s\n", sc->name,
			   sc->counted ? " [COUNT]" : "", sc->help);
	}
}

static int edu_list_show(struct seq_file *m, void *v)
{
	edu_list(m, &edu_run_table);
	return 0;
}

static int edu_stress_list_show(struct seq_file *m, void *v)
{
	edu_list(m, &edu_stress_table);
	return 0;
}

static int edu_burst_cpus_show(struct seq_file *m, void *v)
{
	struct edu_ex *ex = m->private;

	seq_printf(m, "%d %d\n", ex->burst_cpu[0], ex->burst_cpu[1]);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(edu_burst_cpus);

static int edu_run_open(struct inode *inode, struct file *file)
{
	return single_open(file, edu_list_show, inode->i_private);
}

static int edu_stress_open(struct inode *inode, struct file *file)
{
	return single_open(file, edu_stress_list_show, inode->i_private);
}

/*
 * A command written to a debugfs file, copied into cmd (size bytes) and
 * NUL-terminated: 0, or -EINVAL for an empty or too long one, -EFAULT.
 */
static int edu_copy_cmd(char *cmd, size_t size, const char __user *ubuf, size_t len)
{
	if (len == 0 || len >= size)
		return -EINVAL;
	if (copy_from_user(cmd, ubuf, len))
		return -EFAULT;
	cmd[len] = '\0';
	return 0;
}

static ssize_t edu_do_write(struct file *file, const char __user *ubuf,
			    size_t len, const struct edu_table *t)
{
	struct edu_ex *ex = ((struct seq_file *)file->private_data)->private;
	const struct edu_scenario *sc;
	char cmd[EDU_CMD_MAX];
	unsigned int count = EDU_DEFAULT_COUNT;
	char *rest, *name, *arg;
	int ret;

	ret = edu_copy_cmd(cmd, sizeof(cmd), ubuf, len);
	if (ret)
		return ret;
	rest = strim(cmd);
	name = strsep(&rest, " \t");
	sc = edu_find(t, name);
	if (!sc)
		return -EINVAL;
	if (rest) {
		arg = skip_spaces(rest);
		if (!sc->counted)
			return -EINVAL;
		ret = kstrtouint(arg, 0, &count);
		if (ret)
			return ret;
		if (count > EDU_MAX_COUNT)
			return -EINVAL;
	}

	ret = mutex_lock_interruptible(&ex->lock);
	if (ret)
		return ret;
	ex->errors = 0;
	ret = sc->run(ex, count);
	mutex_unlock(&ex->lock);
	return ret ? ret : len;
}

static ssize_t edu_run_write(struct file *file, const char __user *ubuf,
			     size_t len, loff_t *ppos)
{
	return edu_do_write(file, ubuf, len, &edu_run_table);
}

static ssize_t edu_stress_write(struct file *file, const char __user *ubuf,
				size_t len, loff_t *ppos)
{
	return edu_do_write(file, ubuf, len, &edu_stress_table);
}

static const struct file_operations edu_run_fops = {
	.owner = THIS_MODULE,
	.open = edu_run_open,
	.read = seq_read,
	.write = edu_run_write,
	.llseek = seq_lseek,
	.release = single_release,
};

static const struct file_operations edu_stress_fops = {
	.owner = THIS_MODULE,
	.open = edu_stress_open,
	.read = seq_read,
	.write = edu_stress_write,
	.llseek = seq_lseek,
	.release = single_release,
};

/*
 * Reading "bar_read" at offset OFF copies up to a page from BAR0 + OFF to
 * the reader's buffer with copy_to_user() straight from a fresh mapping:
 * with ERMS, 64 bytes or more are one rep movsb from MMIO to user memory.
 */
static ssize_t edu_bar_read(struct file *file, char __user *ubuf, size_t len,
			    loff_t *ppos)
{
	struct edu_ex *ex = file->private_data;
	void __iomem *base;
	unsigned long left;
	loff_t pos = *ppos;
	size_t n;

	if (pos < 0 || pos >= ex->len)
		return 0;
	n = min_t(size_t, len, min_t(loff_t, ex->len - pos, PAGE_SIZE));
	base = edu_map(ex);
	if (!base)
		return -ENOMEM;
	left = copy_to_user(ubuf, (const void __force *)(base + pos), n);
	edu_unmap(ex, base);
	if (left == n)
		return -EFAULT;
	*ppos = pos + n - left;
	return n - left;
}

static const struct file_operations edu_bar_read_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.read = edu_bar_read,
	.llseek = default_llseek,
};

/*
 * Reading "bar_read_nostac" copies BAR0's first 4 bytes to the reader's
 * buffer with a rep movsb of its own, without stac: with SMAP on, the CPU
 * refuses the user side and the kernel oopses here, as it does for a
 * driver with this bug.  A test of the tracer leaving that as it is.
 */
static ssize_t edu_bar_read_nostac(struct file *file, char __user *ubuf, size_t len,
				   loff_t *ppos)
{
	struct edu_ex *ex = file->private_data;
	void __iomem *base;
	const void *src;
	void *dst = (void __force *)ubuf;
	unsigned long n = 4;

	if (len < n)
		return -EINVAL;
	base = edu_map(ex);
	if (!base)
		return -ENOMEM;
	src = (const void __force *)base;
	asm volatile("rep movsb" : "+D" (dst), "+S" (src), "+c" (n) : : "memory");
	edu_unmap(ex, base);
	return 4;
}

static const struct file_operations edu_bar_read_nostac_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.read = edu_bar_read_nostac,
	.llseek = default_llseek,
};

/* ---- a mapping held open across whatever the test does ------------- */

/*
 * Writing "map" to "hold" maps BAR0 and keeps the mapping; "touch" reads
 * the ident register and writes and reads back the liveness register
 * through it (a wrong value: -EIO); "unmap" unmaps it; "unmap_inner"
 * unmaps it by the address of its second page (a driver's bug: iounmap()
 * frees the area that holds the address); "move" (nothing held) moves BAR0
 * elsewhere, as a driver resizing its BAR in its probe does: released,
 * its old range kept taken meanwhile, assigned anew; "moveback" puts it
 * back where it was before, as the kernel undoes a resize that failed
 * (released, claimed at the old range, the BAR register rewritten).
 * Reading "hold"
 * gives "virt 0x... pages N present P": how many of the mapping's pages
 * the kernel's page table maps right now, read with lookup_address(), so
 * a test can see whether a page was left not-present without asking the
 * module that made it so.
 */
static void edu_show_range(struct seq_file *m, struct edu_ex *ex, unsigned long virt)
{
	unsigned long i, npages, present = 0;
	unsigned int level;
	pte_t *pte;

	npages = virt ? DIV_ROUND_UP(ex->len, PAGE_SIZE) : 0;
	for (i = 0; i < npages; i++) {
		pte = lookup_address(virt + i * PAGE_SIZE, &level);
		if (pte && pte_present(*pte))
			present++;
	}
	seq_printf(m, "virt 0x%lx pages %lu present %lu\n", virt, npages, present);
}

static int edu_hold_show(struct seq_file *m, void *unused)
{
	struct edu_ex *ex = m->private;

	mutex_lock(&ex->hold_lock);
	edu_show_range(m, ex, (unsigned long)ex->held);
	mutex_unlock(&ex->hold_lock);
	return 0;
}

/*
 * Reading "held_last" gives the same for the range the held mapping had
 * before "unmap": freed address space, where no page may be present
 * (nobody else mapped it since, as far as the test arranges).
 */
static int edu_held_last_show(struct seq_file *m, void *unused)
{
	struct edu_ex *ex = m->private;

	mutex_lock(&ex->hold_lock);
	edu_show_range(m, ex, ex->held_last);
	mutex_unlock(&ex->hold_lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(edu_held_last);

static int edu_hold_open(struct inode *inode, struct file *file)
{
	return single_open(file, edu_hold_show, inode->i_private);
}

static int edu_hold_touch(struct edu_ex *ex)
{
	u32 v = 0x12345678;

	if (readl(ex->held + EDU_REG_IDENT) != EDU_IDENT_VALUE)
		return -EIO;
	writel(v, ex->held + EDU_REG_LIVE);
	return readl(ex->held + EDU_REG_LIVE) == ~v ? 0 : -EIO;
}

static int edu_move_bar0(struct edu_ex *ex)
{
	struct pci_dev *pdev = ex->pdev;
	struct resource *r = &pdev->resource[0];
	struct resource *parent = r->parent;
	struct resource old = DEFINE_RES_MEM_NAMED(r->start, resource_size(r),
						   "edu_exerciser: old BAR0");
	u16 cmd;
	int ret;

	if (!parent)
		return -ENXIO;
	pci_read_config_word(pdev, PCI_COMMAND, &cmd);
	pci_write_config_word(pdev, PCI_COMMAND, cmd & ~PCI_COMMAND_MEMORY);
	pci_release_resource(pdev, 0);
	ret = request_resource(parent, &old);
	if (!ret) {
		ret = pci_assign_resource(pdev, 0);
		release_resource(&old);
	}
	if (ret)	/* back where it was */
		ret = pci_assign_resource(pdev, 0) ?: ret;
	pci_write_config_word(pdev, PCI_COMMAND, cmd);
	if (!ret)
		ex->moved_from = old.start;
	ex->start = pci_resource_start(pdev, 0);
	return ret;
}

static int edu_move_bar0_back(struct edu_ex *ex)
{
	struct pci_dev *pdev = ex->pdev;
	struct resource *r = &pdev->resource[0];
	resource_size_t size = resource_size(r);
	u16 cmd;
	int ret;

	if (!ex->moved_from)
		return -ENXIO;
	pci_read_config_word(pdev, PCI_COMMAND, &cmd);
	pci_write_config_word(pdev, PCI_COMMAND, cmd & ~PCI_COMMAND_MEMORY);
	pci_release_resource(pdev, 0);
	r->start = ex->moved_from;
	r->end = ex->moved_from + size - 1;
	r->flags &= ~IORESOURCE_UNSET;
	ret = pci_claim_resource(pdev, 0);
	if (!ret)
		ret = pcibios_err_to_errno(pci_write_config_dword(pdev, PCI_BASE_ADDRESS_0,
								  lower_32_bits(r->start)));
	else	/* anywhere */
		ret = pci_assign_resource(pdev, 0) ?: ret;
	pci_write_config_word(pdev, PCI_COMMAND, cmd);
	ex->moved_from = 0;
	ex->start = pci_resource_start(pdev, 0);
	return ret;
}

/*
 * The machine dies on purpose, after COUNT writes of EDU_CRASH_BASE + i to
 * the liveness register (the flight recorder's tests): "panic COUNT" calls
 * panic(), "oops COUNT" stores through a NULL pointer, "lockup COUNT"
 * spins with interrupts off until a watchdog (or the RCU stall detector
 * with kernel.panic_on_rcu_stall) panics.  Root only (0200), and only
 * after edu_exerciser.allow_crash=1.
 */
#define EDU_CRASH_BASE	0xf1000000u

/* a pointer the compiler cannot prove NULL: the oops is a real fault */
unsigned long edu_crash_null;

static bool edu_allow_crash;
module_param_named(allow_crash, edu_allow_crash, bool, 0600);
MODULE_PARM_DESC(allow_crash, "let the crash file kill the machine (tests)");

static ssize_t edu_crash_write(struct file *file, const char __user *ubuf,
			       size_t len, loff_t *ppos)
{
	struct edu_ex *ex = file->private_data;
	void __iomem *base;
	char cmd[32], how[16];
	unsigned int count, i;
	int ret;

	if (!edu_allow_crash)
		return -EPERM;
	ret = edu_copy_cmd(cmd, sizeof(cmd), ubuf, len);
	if (ret)
		return ret;
	if (sscanf(cmd, "%15s %u", how, &count) != 2 || count > 1000000)
		return -EINVAL;
	if (strcmp(how, "panic") && strcmp(how, "oops") && strcmp(how, "lockup"))
		return -EINVAL;
	base = edu_map(ex);
	if (!base)
		return -ENOMEM;
	for (i = 0; i < count; i++)
		writel(EDU_CRASH_BASE + i, base + EDU_REG_LIVE);
	if (!strcmp(how, "panic"))
		panic("edu_exerciser: panic after %u writes", count);
	if (!strcmp(how, "oops"))
		*(volatile unsigned int *)(unsigned long)edu_crash_null = count;
	local_irq_disable();
	for (;;)
		cpu_relax();
	return len;
}

static const struct file_operations edu_crash_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = edu_crash_write,
	.llseek = noop_llseek,
};

static ssize_t edu_hold_write(struct file *file, const char __user *ubuf,
			      size_t len, loff_t *ppos)
{
	struct edu_ex *ex = ((struct seq_file *)file->private_data)->private;
	char cmd[16];
	bool move;
	int ret = 0;

	ret = edu_copy_cmd(cmd, sizeof(cmd), ubuf, len);
	if (ret)
		return ret;
	strim(cmd);
	/*
	 * Only a move waits for the scenario running (it moves the BAR the
	 * scenario uses): the held mapping is used and read beside scenarios
	 * that run until stopped.
	 */
	move = !strcmp(cmd, "move") || !strcmp(cmd, "moveback");
	if (move)
		mutex_lock(&ex->lock);
	mutex_lock(&ex->hold_lock);
	if (!strcmp(cmd, "map")) {
		if (ex->held)
			ret = -EBUSY;
		else
			ex->held = edu_map(ex);
		if (!ret && !ex->held)
			ret = -ENOMEM;
	} else if (!strcmp(cmd, "touch")) {
		ret = ex->held ? edu_hold_touch(ex) : -ENXIO;
	} else if (!strcmp(cmd, "move")) {
		ret = ex->held ? -EBUSY : edu_move_bar0(ex);
	} else if (!strcmp(cmd, "moveback")) {
		ret = ex->held ? -EBUSY : edu_move_bar0_back(ex);
	} else if (!strcmp(cmd, "unmap") || !strcmp(cmd, "unmap_inner")) {
		if (!ex->held)
			ret = -ENXIO;
		else if (cmd[5])	/* a driver's bug that frees it all the same */
			iounmap(ex->held + PAGE_SIZE);
		else
			pci_iounmap(ex->pdev, ex->held);
		if (ex->held)
			ex->held_last = (unsigned long)ex->held & PAGE_MASK;
		ex->held = NULL;
	} else {
		ret = -EINVAL;
	}
	mutex_unlock(&ex->hold_lock);
	if (move)
		mutex_unlock(&ex->lock);
	return ret ? ret : len;
}

static const struct file_operations edu_hold_fops = {
	.owner = THIS_MODULE,
	.open = edu_hold_open,
	.read = seq_read,
	.write = edu_hold_write,
	.llseek = seq_lseek,
	.release = single_release,
};

/* ---- any other device (bound with new_id): map a BAR, access it ---- */

/*
 * For a device that is not edu (bound through
 * /sys/bus/pci/drivers/edu_exerciser/new_id, e.g. QEMU's ivshmem-plain,
 * whose BAR2 is plain memory): writing "BAR CALL [OFFSET LENGTH]" to
 * /sys/kernel/debug/edu_exerciser-<pci name>/map maps the whole BAR, or
 * LENGTH bytes of it from OFFSET, with CALL (ioremap, ioremap_wc,
 * ioremap_uc, ioremap_wt, ioremap_cache, pci_iomap_wc), writes a 32-bit
 * pattern at the mapping's start, middle and last 8 bytes and reads each
 * back (a wrong value: -EIO), then unmaps.  The pattern at BAR offset o is
 * 0x5a000000 | i << 16 | (o >> 12 & 0xffff) for the i-th of them.  "level"
 * says which page-table level the kernel mapped its start with: 1 (4K),
 * 2 (2M) or 3 (1G).  Writing "BAR SRC DST" to "movs" maps the whole BAR
 * (ioremap) and makes one movsl from BAR + SRC to BAR + DST (e.g. from a
 * register that clears when read: a second read would copy another value).
 * Writing "BAR BYTES" to "blit" copies BYTES into the BAR with one
 * memcpy_toio (edu_any_blit_write).
 */
struct edu_any {
	struct pci_dev *pdev;
	struct dentry *dir;
	struct mutex lock;	/* one map, movs or poke at a time */
	u32 level;
	u32 poked;		/* the value the last "poke" read back */
};

static void __iomem *edu_any_map(struct pci_dev *pdev, int bar, const char *call,
				 u64 off, u64 len)
{
	resource_size_t start = pci_resource_start(pdev, bar) + off;

	if (!strcmp(call, "ioremap"))
		return ioremap(start, len);
	if (!strcmp(call, "ioremap_wc"))
		return ioremap_wc(start, len);
	if (!strcmp(call, "ioremap_uc"))
		return ioremap_uc(start, len);
	if (!strcmp(call, "ioremap_wt"))
		return ioremap_wt(start, len);
	if (!strcmp(call, "ioremap_cache"))
		return (void __iomem *)ioremap_cache(start, len);
	if (!strcmp(call, "pci_iomap_wc"))
		return pci_iomap_wc_range(pdev, bar, off, len);
	return ERR_PTR(-EINVAL);
}

static ssize_t edu_any_write(struct file *file, const char __user *ubuf,
			     size_t len, loff_t *ppos)
{
	struct edu_any *any = file->private_data;
	char cmd[EDU_CMD_MAX], call[EDU_CMD_MAX];
	u64 off = 0, size, offs[3];
	void __iomem *p;
	unsigned int lvl;
	int ret, n;
	int bar, i, bad = 0;

	ret = edu_copy_cmd(cmd, sizeof(cmd), ubuf, len);
	if (ret)
		return ret;
	n = sscanf(cmd, "%d %63s %lli %lli", &bar, call, &off, &size);
	if ((n != 2 && n != 4) || bar < 0 || bar >= PCI_STD_NUM_BARS ||
	    !(pci_resource_flags(any->pdev, bar) & IORESOURCE_MEM))
		return -EINVAL;
	if (n == 2)
		size = pci_resource_len(any->pdev, bar);
	if (size < 16 || off > pci_resource_len(any->pdev, bar) ||
	    size > pci_resource_len(any->pdev, bar) - off)
		return -EINVAL;
	mutex_lock(&any->lock);
	p = edu_any_map(any->pdev, bar, call, off, size);
	if (IS_ERR_OR_NULL(p)) {
		mutex_unlock(&any->lock);
		return p ? PTR_ERR(p) : -ENOMEM;
	}
	any->level = lookup_address((unsigned long)p, &lvl) ? lvl : 0;
	offs[0] = 0;
	offs[1] = (size / 2) & ~7ULL;
	offs[2] = size - 8;
	for (i = 0; i < 3; i++) {
		u32 v = 0x5a000000 | (i << 16) | (u32)((off + offs[i]) >> 12 & 0xffff);

		writel(v, p + offs[i]);
		if (readl(p + offs[i]) != v)
			bad++;
	}
	if (!strcmp(call, "pci_iomap_wc"))
		pci_iounmap(any->pdev, p);
	else
		iounmap(p);
	mutex_unlock(&any->lock);
	return bad ? -EIO : len;
}

static const struct file_operations edu_any_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = edu_any_write,
	.llseek = default_llseek,
};

static ssize_t edu_any_movs_write(struct file *file, const char __user *ubuf,
				  size_t len, loff_t *ppos)
{
	struct edu_any *any = file->private_data;
	char cmd[EDU_CMD_MAX];
	unsigned long src, dst, n = 1;
	resource_size_t size;
	void __iomem *p;
	void *from, *to;
	int ret;
	int bar;

	ret = edu_copy_cmd(cmd, sizeof(cmd), ubuf, len);
	if (ret)
		return ret;
	if (sscanf(cmd, "%d %li %li", &bar, &src, &dst) != 3 || bar < 0 ||
	    bar >= PCI_STD_NUM_BARS || !(pci_resource_flags(any->pdev, bar) & IORESOURCE_MEM))
		return -EINVAL;
	size = pci_resource_len(any->pdev, bar);
	if (src > size - 4 || dst > size - 4 || (src | dst) & 3)
		return -EINVAL;
	mutex_lock(&any->lock);
	p = ioremap(pci_resource_start(any->pdev, bar), size);
	if (!p) {
		mutex_unlock(&any->lock);
		return -ENOMEM;
	}
	from = (void __force *)(p + src);
	to = (void __force *)(p + dst);
	asm volatile("rep movsl" : "+S" (from), "+D" (to), "+c" (n) : : "memory");
	iounmap(p);
	mutex_unlock(&any->lock);
	return len;
}

static const struct file_operations edu_any_movs_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = edu_any_movs_write,
	.llseek = default_llseek,
};

/*
 * "poke": "BAR OFFSET VALUE" maps the BAR (its own size, as a driver does),
 * writes VALUE at OFFSET and reads it back (kept in "poked").  OFFSET may
 * lie past the BAR's end, anywhere in the page(s) the mapping covers: the
 * registers of a device whose BAR shares the page, reached through this
 * device's mapping.  -EIO when the value read differs.
 */
static ssize_t edu_any_poke_write(struct file *file, const char __user *ubuf,
				  size_t len, loff_t *ppos)
{
	struct edu_any *any = file->private_data;
	resource_size_t start, size, reach;
	unsigned long off;
	char cmd[EDU_CMD_MAX];
	void __iomem *p;
	u32 val, got;
	int ret;
	int bar;

	ret = edu_copy_cmd(cmd, sizeof(cmd), ubuf, len);
	if (ret)
		return ret;
	if (sscanf(cmd, "%d %li %i", &bar, &off, &val) != 3 || bar < 0 ||
	    bar >= PCI_STD_NUM_BARS || !(pci_resource_flags(any->pdev, bar) & IORESOURCE_MEM))
		return -EINVAL;
	start = pci_resource_start(any->pdev, bar);
	size = pci_resource_len(any->pdev, bar);
	reach = PAGE_ALIGN(offset_in_page(start) + size) - offset_in_page(start);
	if (off > reach - 4 || off & 3)
		return -EINVAL;
	mutex_lock(&any->lock);
	p = ioremap(start, size);
	if (!p) {
		mutex_unlock(&any->lock);
		return -ENOMEM;
	}
	writel(val, p + off);
	got = readl(p + off);
	any->poked = got;
	iounmap(p);
	mutex_unlock(&any->lock);
	return got == val ? len : -EIO;
}

/*
 * "blit": "BAR BYTES" maps the first BYTES of the BAR write-combining (as
 * a GPU driver maps VRAM) and copies BYTES there with one memcpy_toio
 * from a buffer whose 32-bit word at BAR offset 4k is
 * EDU_BLIT_WORD(k): rep movsl, BYTES / 4 stores in one instruction.
 */
#define EDU_BLIT_WORD(k)	((u32)(0x9e3779b1U * ((u32)(k) + 1)))

static ssize_t edu_any_blit_write(struct file *file, const char __user *ubuf,
				  size_t len, loff_t *ppos)
{
	struct edu_any *any = file->private_data;
	char cmd[EDU_CMD_MAX];
	unsigned long bytes, k;
	void __iomem *p;
	u32 *buf;
	int ret;
	int bar;

	ret = edu_copy_cmd(cmd, sizeof(cmd), ubuf, len);
	if (ret)
		return ret;
	if (sscanf(cmd, "%d %li", &bar, &bytes) != 2 || bar < 0 ||
	    bar >= PCI_STD_NUM_BARS || !(pci_resource_flags(any->pdev, bar) & IORESOURCE_MEM))
		return -EINVAL;
	if (!bytes || bytes & 3 || bytes > pci_resource_len(any->pdev, bar) ||
	    bytes > SZ_256M)
		return -EINVAL;
	buf = kvmalloc(bytes, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	for (k = 0; k < bytes / 4; k++)
		buf[k] = EDU_BLIT_WORD(k);
	mutex_lock(&any->lock);
	p = ioremap_wc(pci_resource_start(any->pdev, bar), bytes);
	if (!p) {
		mutex_unlock(&any->lock);
		kvfree(buf);
		return -ENOMEM;
	}
	memcpy_toio(p, buf, bytes);
	iounmap(p);
	mutex_unlock(&any->lock);
	kvfree(buf);
	return len;
}

static const struct file_operations edu_any_blit_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = edu_any_blit_write,
	.llseek = default_llseek,
};

static const struct file_operations edu_any_poke_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = edu_any_poke_write,
	.llseek = default_llseek,
};

static int edu_any_probe(struct pci_dev *pdev)
{
	struct edu_any *any;
	char name[64];
	int ret;

	any = devm_kzalloc(&pdev->dev, sizeof(*any), GFP_KERNEL);
	if (!any)
		return -ENOMEM;
	any->pdev = pdev;
	mutex_init(&any->lock);
	ret = pci_enable_device(pdev);
	if (ret)
		return ret;
	snprintf(name, sizeof(name), KBUILD_MODNAME "-%s", pci_name(pdev));
	any->dir = debugfs_create_dir(name, NULL);
	if (IS_ERR(any->dir)) {
		pci_disable_device(pdev);
		return PTR_ERR(any->dir);
	}
	debugfs_create_file("map", 0200, any->dir, any, &edu_any_fops);
	debugfs_create_file("movs", 0200, any->dir, any, &edu_any_movs_fops);
	debugfs_create_file("poke", 0200, any->dir, any, &edu_any_poke_fops);
	debugfs_create_file("blit", 0200, any->dir, any, &edu_any_blit_fops);
	debugfs_create_u32("level", 0444, any->dir, &any->level);
	debugfs_create_x32("poked", 0444, any->dir, &any->poked);
	pci_set_drvdata(pdev, any);
	return 0;
}

static bool edu_is_edu(const struct pci_dev *pdev)
{
	return pdev->vendor == EDU_VENDOR_ID && pdev->device == EDU_DEVICE_ID;
}

static int edu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct edu_ex *ex;
	struct dentry *file;
	int ret;

	if (!edu_is_edu(pdev))
		return edu_any_probe(pdev);

	ex = devm_kzalloc(&pdev->dev, sizeof(*ex), GFP_KERNEL);
	if (!ex)
		return -ENOMEM;
	ex->pdev = pdev;
	ex->burst_cpu[0] = -1;
	ex->burst_cpu[1] = -1;
	mutex_init(&ex->lock);
	mutex_init(&ex->hold_lock);

	ret = pci_enable_device(pdev);
	if (ret)
		return ret;
	ret = pci_request_regions(pdev, KBUILD_MODNAME);
	if (ret)
		goto err_disable;
	if (!(pci_resource_flags(pdev, 0) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, 0) < EDU_MIN_BAR_LEN) {
		ret = -ENODEV;
		goto err_release;
	}
	ex->start = pci_resource_start(pdev, 0);
	ex->len = pci_resource_len(pdev, 0);

	ex->dir = debugfs_create_dir(KBUILD_MODNAME, NULL);
	if (IS_ERR(ex->dir)) {
		ret = PTR_ERR(ex->dir);
		goto err_release;
	}
	file = debugfs_create_file("run", 0600, ex->dir, ex, &edu_run_fops);
	if (IS_ERR(file)) {
		ret = PTR_ERR(file);
		goto err_debugfs;
	}
	file = debugfs_create_file("burst_cpus", 0444, ex->dir, ex,
				   &edu_burst_cpus_fops);
	if (IS_ERR(file)) {
		ret = PTR_ERR(file);
		goto err_debugfs;
	}
	debugfs_create_u64("mismatches", 0444, ex->dir, &ex->mismatches);
	file = debugfs_create_file("stress", 0600, ex->dir, ex,
				   &edu_stress_fops);
	if (IS_ERR(file)) {
		ret = PTR_ERR(file);
		goto err_debugfs;
	}
	file = debugfs_create_file("bar_read", 0400, ex->dir, ex,
				   &edu_bar_read_fops);
	if (IS_ERR(file)) {
		ret = PTR_ERR(file);
		goto err_debugfs;
	}
	/*
	 * unsafe: without debugfs's proxy, whose count of the reads in
	 * progress would keep the one the oops ended, and the removal of the
	 * file would wait for it for ever; .owner keeps the module while it
	 * is open, and a task killed by an oops closes its files
	 */
	file = debugfs_create_file_unsafe("bar_read_nostac", 0400, ex->dir, ex,
					  &edu_bar_read_nostac_fops);
	if (IS_ERR(file)) {
		ret = PTR_ERR(file);
		goto err_debugfs;
	}
	file = debugfs_create_file("hold", 0600, ex->dir, ex, &edu_hold_fops);
	if (IS_ERR(file)) {
		ret = PTR_ERR(file);
		goto err_debugfs;
	}
	file = debugfs_create_file("crash", 0200, ex->dir, ex, &edu_crash_fops);
	if (IS_ERR(file)) {
		ret = PTR_ERR(file);
		goto err_debugfs;
	}
	file = debugfs_create_file("held_last", 0400, ex->dir, ex, &edu_held_last_fops);
	if (IS_ERR(file)) {
		ret = PTR_ERR(file);
		goto err_debugfs;
	}
	debugfs_create_ulong("stride_virt", 0400, ex->dir, &ex->stride_virt);
	debugfs_create_ulong("maploop_virt", 0400, ex->dir, &ex->maploop_virt);
	debugfs_create_ulong("wc_virt", 0400, ex->dir, &ex->wc_virt);
	debugfs_create_x32("nonpci_value", 0400, ex->dir, &ex->nonpci_value);
	debugfs_create_x64("pc_read", 0400, ex->dir, &ex->pc_read);
	debugfs_create_x64("pc_write", 0400, ex->dir, &ex->pc_write);
	debugfs_create_u32("maploop_hold_us", 0600, ex->dir,
			   &ex->maploop_hold_us);
	debugfs_create_u32("stride_flush", 0600, ex->dir, &ex->stride_flush);
	debugfs_create_u32("errors", 0400, ex->dir, &ex->errors);
	debugfs_create_u32("memset_bytes", 0444, ex->dir, &ex->memset_bytes);
	debugfs_create_u32("nmi_reads", 0444, ex->dir, &ex->nmi_reads);
	debugfs_create_u32("nmi_second", 0444, ex->dir, &ex->nmi_second);
	debugfs_create_u32("nmi_unknown", 0600, ex->dir, &ex->nmi_unknown);
	debugfs_create_u32("crossirq_reads", 0444, ex->dir, &ex->crossirq_reads);
	debugfs_create_x64("dma_to", 0444, ex->dir, &ex->dma_to);
	debugfs_create_x64("dma_from", 0444, ex->dir, &ex->dma_from);
	debugfs_create_u32("irq_handled", 0444, ex->dir, &ex->irq_handled);
	debugfs_create_u32("irq_vector", 0444, ex->dir, &ex->irq_vector);

	pci_set_drvdata(pdev, ex);
	dev_info(&pdev->dev, "BAR0 %pa, %llu bytes\n", &ex->start,
		 (unsigned long long)ex->len);
	return 0;

err_debugfs:
	debugfs_remove_recursive(ex->dir);
err_release:
	pci_release_regions(pdev);
err_disable:
	pci_disable_device(pdev);
	return ret;
}

static void edu_remove(struct pci_dev *pdev)
{
	struct edu_ex *ex = pci_get_drvdata(pdev);

	if (!edu_is_edu(pdev)) {
		struct edu_any *any = pci_get_drvdata(pdev);

		debugfs_remove_recursive(any->dir);
		pci_disable_device(pdev);
		mutex_destroy(&any->lock);
		return;
	}

	/* Waits for a running scenario to finish. */
	debugfs_remove_recursive(ex->dir);
	if (ex->held)
		pci_iounmap(pdev, ex->held);
	pci_release_regions(pdev);
	pci_disable_device(pdev);
	mutex_destroy(&ex->lock);
}

static const struct pci_device_id edu_ids[] = {
	{ PCI_DEVICE(EDU_VENDOR_ID, EDU_DEVICE_ID) },
	{ }
};
MODULE_DEVICE_TABLE(pci, edu_ids);

static struct pci_driver edu_driver = {
	.name = KBUILD_MODNAME,
	.id_table = edu_ids,
	.probe = edu_probe,
	.remove = edu_remove,
};
module_pci_driver(edu_driver);

MODULE_DESCRIPTION("Deterministic MMIO scenarios on QEMU's edu device");
MODULE_LICENSE("GPL");
