/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Instruction decoder and emulator for the accesses that fault on a traced
 * (not-present) MMIO page, x86-64 64-bit mode only.
 *
 * Pure C: it builds in the kernel and, with NG_DECODE_HOST defined, on the
 * host for the unit tests (tests/unit/test_decode.py).  It has no state,
 * allocates nothing, uses no floating point and does not recurse.
 *
 * Supported (everything else is -EINVAL; the caller single-steps it):
 *   88/89 mov r/m,r      8A/8B mov r,r/m      C6 /0 ib, C7 /0 iw/id
 *   0F B6/B7 movzx       0F BE/BF movsx       REX.W 63 movsxd
 *   A4/A5 movs           AA/AB stos           (F3 rep on movs/stos only)
 * Prefixes: 66, F3 (string instructions), 2E/36/3E/26 (ignored), REX.
 * Rejected: 67, F0, F2, 64/65 (FS/GS), mod=11, 63 without REX.W,
 * instructions longer than 15 bytes or longer than the bytes available.
 *
 * ng_decode_alu() knows these too, with a memory operand (for accesses
 * from user mode, which are never single-stepped):
 *   00-3B op r/m,r and op r,r/m (add or adc sbb and sub xor cmp)
 *   80/81/83 op r/m,imm     84/85 test r/m,r    F6/F7 /0 test r/m,imm
 *   F6/F7 /2 not, /3 neg    FE/FF /0 inc, /1 dec
 * The emulation is a read and a write: not atomic against another CPU
 * doing the same, as the instruction is not without a lock, so a locked
 * one (F0, and xchg, locked always) is refused.
 */
#ifndef NG_DECODE_H
#define NG_DECODE_H

#ifdef NG_DECODE_HOST
#include <stdbool.h>
#include <stddef.h>
#include <errno.h>
#include <string.h>

/* The kernel's own definitions (asm-generic/int-ll64.h) */
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char s8;
typedef short s16;
typedef int s32;
typedef long long s64;

#define fallthrough __attribute__((__fallthrough__))

/*
 * The kernel's struct pt_regs (x86-64).  The host's <asm/ptrace.h> has the
 * same layout but names the fields rax, rbx, ..., so it is not used here.
 */
struct pt_regs {
	unsigned long r15;
	unsigned long r14;
	unsigned long r13;
	unsigned long r12;
	unsigned long bp;
	unsigned long bx;
	unsigned long r11;
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long ax;
	unsigned long cx;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long cs;
	unsigned long flags;
	unsigned long sp;
	unsigned long ss;
};
#else
#include <linux/types.h>
#include <linux/errno.h>
#include <linux/stddef.h>
#include <linux/string.h>
#include <asm/ptrace.h>
#endif

#define NG_INSN_MAX_LEN		15

/*
 * Bytes ng_compat() may need: the kernel's mmiotrace reads up to 4 bytes
 * past the end of a 15-byte "mov $imm32, m64" (it reads 8 immediate bytes).
 */
#define NG_COMPAT_MAX_BYTES	(NG_INSN_MAX_LEN + 4)

/* enum ng_kind: struct ng_insn.kind */
enum ng_kind {
	NG_KIND_NONE = 0,
	NG_KIND_LOAD,		/* 8A/8B   mov reg, mem */
	NG_KIND_STORE,		/* 88/89   mov mem, reg */
	NG_KIND_STORE_IMM,	/* C6/C7   mov mem, imm */
	NG_KIND_MOVZX,		/* 0F B6/B7 movzx reg, mem */
	NG_KIND_MOVSX,		/* 0F BE/BF movsx, REX.W 63 movsxd reg, mem */
	NG_KIND_MOVS,		/* A4/A5   movs [rdi], [rsi] */
	NG_KIND_STOS,		/* AA/AB   stos [rdi], rAX */
	NG_KIND_ALU_MEM,	/* an ALU op on memory (ng_decode_alu) */
	NG_KIND_ALU_REG,	/* an ALU op r, r/m: the register is written */
};

/* enum ng_alu: struct ng_insn.alu; 0..7 as the opcode's bits 3..5 */
enum ng_alu {
	NG_ALU_ADD = 0,
	NG_ALU_OR,
	NG_ALU_ADC,
	NG_ALU_SBB,
	NG_ALU_AND,
	NG_ALU_SUB,
	NG_ALU_XOR,
	NG_ALU_CMP,
	NG_ALU_TEST,
	NG_ALU_NOT,
	NG_ALU_NEG,
	NG_ALU_INC,
	NG_ALU_DEC,
};

/* Register numbers (ModRM order); NG_REG_RIP only as a base. */
#define NG_REG_AX	0
#define NG_REG_CX	1
#define NG_REG_DX	2
#define NG_REG_BX	3
#define NG_REG_SP	4
#define NG_REG_BP	5
#define NG_REG_SI	6
#define NG_REG_DI	7
/* 8..15: r8..r15 */
#define NG_REG_RIP	16
#define NG_REG_NONE	0xff

/* REX bits in struct ng_insn.rex_bits */
#define NG_REX_B	0x1
#define NG_REX_X	0x2
#define NG_REX_R	0x4
#define NG_REX_W	0x8

/* Access direction; same values as MMIOTNG_OP_* in mmiotng_abi.h */
#define NG_OP_READ	0
#define NG_OP_WRITE	1
#define NG_OP_UNKNOWN	2

/* DF, bit 10 of RFLAGS */
#define NG_FLAGS_DF	0x400UL
/* the arithmetic flags: CF PF AF ZF SF OF */
#define NG_FLAGS_CF	0x001UL
#define NG_FLAGS_ARITH	0x8d5UL

/**
 * struct ng_insn - a decoded instruction
 * @len: length in bytes, prefixes included (1..15)
 * @kind: enum ng_kind
 * @opcode: the opcode byte (the second byte of 0F xx)
 * @mem_width: bytes of one memory access (one element of movs/stos)
 * @reg_width: bytes of the register operand: the destination of a load or
 *	movzx/movsx, the source of a store or stos; 0 for STORE_IMM and MOVS
 * @reg: register operand, NG_REG_AX..15 (stos: NG_REG_AX), or NG_REG_NONE
 * @high8: @reg is AH/CH/DH/BH (byte register 4..7 without REX); @reg
 *	then holds 4..7 and the byte is bits 8..15 of register @reg - 4
 * @rex: an effective REX prefix is present (the one right before the
 *	opcode; a REX followed by another prefix is ignored)
 * @rex_bits: W/R/X/B of the effective REX (NG_REX_*)
 * @opsize: a 66 prefix is present
 * @rep: an F3 prefix on movs/stos
 * @seg: the last segment prefix (2E/36/3E/26, all ignored), or 0
 * @has_modrm: the instruction has a ModRM byte (all but movs/stos)
 * @modrm: the ModRM byte
 * @has_sib: the instruction has a SIB byte
 * @sib: the SIB byte
 * @base: base register 0..15, NG_REG_RIP, or NG_REG_NONE
 * @index: index register 0..15 or NG_REG_NONE
 * @scale: 1, 2, 4 or 8, as encoded (1 without SIB; kept without index)
 * @disp: the displacement, sign-extended (0 without one)
 * @imm: STORE_IMM: the value stored, zero-extended from @mem_width bytes
 *	(the imm32 of a REX.W C7 is sign-extended to 64 bits); an ALU op
 *	with an immediate (@has_imm): the operand, sign-extended as the CPU
 *	does and cut to @mem_width bytes
 * @alu: ALU_MEM, ALU_REG: enum ng_alu
 * @has_imm: the ALU op's other operand is @imm, not @reg
 */
struct ng_insn {
	u8 len;
	u8 kind;
	u8 opcode;
	u8 mem_width;
	u8 reg_width;
	u8 reg;
	bool high8;
	bool rex;
	u8 rex_bits;
	bool opsize;
	bool rep;
	u8 seg;
	bool has_modrm;
	u8 modrm;
	bool has_sib;
	u8 sib;
	u8 base;
	u8 index;
	u8 scale;
	s32 disp;
	u64 imm;
	u8 alu;
	bool has_imm;
};

/**
 * ng_decode() - decode one instruction
 * @buf: the instruction bytes
 * @avail: bytes readable at @buf; never read beyond
 * @out: filled on success
 *
 * Return: 0, or -EINVAL if the instruction is not supported, is not a
 * memory access or is longer than @avail or 15 bytes.
 */
int ng_decode(const u8 *buf, unsigned int avail, struct ng_insn *out);

/**
 * ng_decode_alu() - ng_decode(), and the ALU instructions on memory
 * @buf: the instruction bytes
 * @avail: bytes readable at @buf; never read beyond
 * @out: filled on success
 *
 * Return: as ng_decode(), for the instructions it knows and those listed
 * at the top of this file.
 */
int ng_decode_alu(const u8 *buf, unsigned int avail, struct ng_insn *out);

/**
 * ng_alu_writes() - whether an ALU op reads its memory operand, then writes it
 * @insn: from ng_decode_alu()
 *
 * Return: true for an ALU_MEM op other than cmp and test.
 */
bool ng_alu_writes(const struct ng_insn *insn);

/**
 * ng_modrm_ea() - effective address of the ModRM memory operand
 * @insn: a decoded instruction with @insn->has_modrm
 * @regs: the registers before the instruction (RIP-relative addresses are
 *	relative to @regs->ip + @insn->len)
 *
 * Return: base + index * scale + disp, modulo 2^64 (0 without ModRM).
 */
unsigned long ng_modrm_ea(const struct ng_insn *insn,
			  const struct pt_regs *regs);

/**
 * ng_gpr() - a general-purpose register of @regs by its number
 * @regs: the registers
 * @no: NG_REG_AX..15
 *
 * Return: the register's slot in @regs, or NULL for any other number.
 */
unsigned long *ng_gpr(struct pt_regs *regs, unsigned int no);

/**
 * ng_operand_value() - the memory value of a mov's register or immediate
 * @insn: a decoded instruction
 * @regs: for a store, the registers before it; for a load, after it
 *
 * Return: the immediate of STORE_IMM, else the low @insn->mem_width bytes
 * of the register operand (AH..BH for @insn->high8); 0 without one (movs).
 */
u64 ng_operand_value(const struct ng_insn *insn, const struct pt_regs *regs);

/**
 * struct ng_access - one memory access made by ng_emulate()
 * @addr: the address the emulator computed for it
 * @value: the value read or written, zero-extended from @width bytes
 * @elem: element number within a movs/stos (0 for the first), else 0
 * @width: 1, 2, 4 or 8
 * @op: NG_OP_READ or NG_OP_WRITE
 */
struct ng_access {
	unsigned long addr;
	u64 value;
	u64 elem;
	u8 width;
	u8 op;
};

/**
 * struct ng_mem_ops - how ng_emulate() reaches memory
 * @read: read exactly @width bytes at @addr into *@val (zero-extended);
 *	return 0 or a negative errno
 * @write: write the low @width bytes of @val at @addr; 0 or -errno
 * @access: optional (may be NULL); called after each successful read or
 *	write, in program order (movs: the read, then the write)
 *
 * Both operands of a movs go through @read/@write; the callbacks decide
 * which addresses are MMIO.  @width is always 1, 2, 4 or 8.
 */
struct ng_mem_ops {
	int (*read)(void *ctx, unsigned long addr, unsigned int width,
		    u64 *val);
	int (*write)(void *ctx, unsigned long addr, unsigned int width,
		     u64 val);
	void (*access)(void *ctx, const struct ng_access *acc);
};

/**
 * ng_plain_move() - whether ng_emulate() does @insn as one plain access
 * @insn: from ng_decode()
 *
 * Return: true for a load, store, store of an immediate, movzx or movsx
 * that ng_emulate() accepts (not a string instruction).
 */
bool ng_plain_move(const struct ng_insn *insn);

/**
 * ng_store_value() - the value a plain store writes
 * @insn: an ng_plain_move() store (register or immediate)
 * @regs: the registers before it
 *
 * Return: the low @insn->mem_width bytes stored, as ng_emulate() writes.
 */
u64 ng_store_value(const struct ng_insn *insn, const struct pt_regs *regs);

/**
 * ng_load_result() - set a plain load's register, as the CPU does
 * @insn: an ng_plain_move() load, movzx or movsx
 * @regs: the registers
 * @val: the value read, zero-extended from @insn->mem_width bytes
 */
void ng_load_result(const struct ng_insn *insn, struct pt_regs *regs, u64 val);

/* ng_emulate(): stopped after @max_elems elements, rcx not yet 0 */
#define NG_EMU_PARTIAL	1

/**
 * ng_emulate() - perform a decoded instruction
 * @insn: from ng_decode()
 * @regs: the registers; updated as the CPU would update them
 * @fault_addr: the faulting address; it must lie within the memory operand
 *	the emulator computes (for movs/stos: the first element at rsi or
 *	rdi), else nothing is done and -EFAULT is returned
 * @ops: memory access callbacks
 * @ctx: passed to @ops
 * @max_elems: for rep movs/stos, the most elements to do in this call
 *	(0: no limit; a kernel caller should bound it, since rcx is
 *	whatever the faulting code left there)
 *
 * Destination registers are written as the CPU does: 32-bit writes zero
 * bits 32..63, 8- and 16-bit writes keep the other bits.  An ALU op reads
 * its memory operand, then writes the result there (ALU_MEM, but not cmp
 * or test) or to its register (ALU_REG, but not cmp), and sets the
 * arithmetic flags as the CPU does (none for not, CF kept by inc
 * and dec, AF cleared by the logical ops).  movs/stos
 * follow DF and update rsi/rdi, and rcx with rep; a rep with rcx == 0
 * does nothing but advance ip.
 *
 * Return: 0 when done (@regs->ip advanced by @insn->len); NG_EMU_PARTIAL
 * when a rep stopped after @max_elems elements (rcx/rsi/rdi updated, ip
 * not advanced: executing the instruction again continues it); -EINVAL
 * for a bad @insn; -EFAULT for a @fault_addr mismatch; or the error of
 * @ops.  After an error of @ops, @regs are unchanged, except that the
 * elements of a movs/stos completed before it stay done (as if the
 * string instruction had been interrupted there).
 */
int ng_emulate(const struct ng_insn *insn, struct pt_regs *regs,
	       unsigned long fault_addr, const struct ng_mem_ops *ops,
	       void *ctx, unsigned long max_elems);

/**
 * ng_compat() - what the kernel's own mmiotrace reports for an access
 * @insn: the instruction bytes (and the bytes after it)
 * @avail: bytes readable at @insn
 * @regs: the registers after the access for a read, before it for a write
 *	(NULL: a register value is reported as 0)
 * @op: NG_OP_READ, NG_OP_WRITE or NG_OP_UNKNOWN
 * @width: the width it reports (0 for unknown)
 * @value: the value it reports
 *
 * Reproduces arch/x86/mm/pf_in.c as built for x86-64, with the results of
 * mmio-mod.c pre()/post(), quirks included: it skips any run of legacy
 * and REX prefixes (REX bits accumulate, 66 wins over REX.W); knows only
 * 88/89/8A/8B/AA/AB/C6/C7 and 0F B6/B7/BE/BF; takes the value of a read
 * from the register after the access, of a write from the register (stos:
 * rAX) or from the immediate it finds by skipping the ModRM byte and a
 * displacement but not a SIB byte, reading as many immediate bytes as the
 * register width (8 for REX.W C7); and for anything else reports unknown
 * with the first three instruction bytes as the value.  *@op does not
 * depend on @regs: a caller can call this before emulating, and again
 * after it when *@op is NG_OP_READ.
 *
 * Return: 0, or -EINVAL when the kernel would read beyond @avail bytes
 * (NG_COMPAT_MAX_BYTES are always enough for a decodable instruction).
 */
int ng_compat(const u8 *insn, unsigned int avail, const struct pt_regs *regs,
	      u8 *op, u8 *width, u64 *value);

/* ng_compat_plan(): the value is that constant */
#define NG_COMPAT_CONST	0xff

/**
 * struct ng_compat_plan - what ng_compat() finds in the bytes alone
 * @op: NG_OP_READ, NG_OP_WRITE or NG_OP_UNKNOWN
 * @width: the width it reports (0 for unknown)
 * @reg: the register the value is taken from, or NG_COMPAT_CONST
 * @high8: the value is bits 8-15 of @reg (AH..BH)
 * @value: the value (NG_COMPAT_CONST), or the mask applied to the register
 *
 * A decoded instruction's plan can be kept with its decoding: the
 * registers only come in through ng_compat_value().
 */
struct ng_compat_plan {
	u8 op;
	u8 width;
	u8 reg;
	bool high8;
	u64 value;
};

/**
 * ng_compat_plan() - the part of ng_compat() that reads only the bytes
 * @insn: the instruction bytes (and the bytes after it)
 * @avail: bytes readable at @insn
 * @p: filled; on an error, an unknown access with width and value 0
 *
 * Return: as ng_compat().
 */
int ng_compat_plan(const u8 *insn, unsigned int avail, struct ng_compat_plan *p);

/**
 * ng_compat_value() - the value ng_compat() reports, from its plan
 * @p: the plan
 * @regs: as for ng_compat()
 *
 * Return: the value.
 */
u64 ng_compat_value(const struct ng_compat_plan *p, const struct pt_regs *regs);

#endif /* NG_DECODE_H */
