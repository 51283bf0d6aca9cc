// SPDX-License-Identifier: GPL-2.0
/*
 * Instruction decoder and emulator for faulting MMIO accesses (x86-64).
 * See ng_decode.h for the interface and what is supported.
 */
#include "ng_decode.h"

/* ------------------------------------------------------------------ */
/* Registers */

/* Where each register is in struct pt_regs, by its number */
static const u8 ng_gpr_off[16] = {
	offsetof(struct pt_regs, ax), offsetof(struct pt_regs, cx),
	offsetof(struct pt_regs, dx), offsetof(struct pt_regs, bx),
	offsetof(struct pt_regs, sp), offsetof(struct pt_regs, bp),
	offsetof(struct pt_regs, si), offsetof(struct pt_regs, di),
	offsetof(struct pt_regs, r8), offsetof(struct pt_regs, r9),
	offsetof(struct pt_regs, r10), offsetof(struct pt_regs, r11),
	offsetof(struct pt_regs, r12), offsetof(struct pt_regs, r13),
	offsetof(struct pt_regs, r14), offsetof(struct pt_regs, r15),
};

unsigned long *ng_gpr(struct pt_regs *regs, unsigned int no)
{
	/* a table, not a switch: no chain of compares (no jump tables here) */
	if (no >= sizeof(ng_gpr_off))
		return NULL;
	return (unsigned long *)((u8 *)regs + ng_gpr_off[no]);
}

static unsigned long ng_gpr_val(const struct pt_regs *regs, unsigned int no)
{
	/* ng_gpr() only computes an address; nothing is written through it */
	unsigned long *p = ng_gpr((struct pt_regs *)regs, no);

	return p ? *p : 0;
}

static u64 ng_mask(unsigned int width)
{
	return width >= 8 ? ~0ULL : (1ULL << (width * 8)) - 1;
}

static u64 ng_sext(u64 val, unsigned int width)
{
	unsigned int shift = 64 - width * 8;

	if (width >= 8)
		return val;
	return (u64)((s64)(val << shift) >> shift);
}

/* The value of register operand @no of @width bytes (high8: AH..BH). */
static u64 ng_reg_get(const struct pt_regs *regs, unsigned int no,
		      unsigned int width, bool high8)
{
	if (high8)
		return (ng_gpr_val(regs, no - 4) >> 8) & 0xff;
	return ng_gpr_val(regs, no) & ng_mask(width);
}

/* Write @val to register operand @no of @width bytes as the CPU does. */
static void ng_reg_set(struct pt_regs *regs, unsigned int no,
		       unsigned int width, bool high8, u64 val)
{
	unsigned long *p;

	if (high8) {
		p = ng_gpr(regs, no - 4);
		if (p)
			*p = (*p & ~0xff00UL) | ((unsigned long)(val & 0xff) << 8);
		return;
	}
	p = ng_gpr(regs, no);
	if (!p)
		return;
	switch (width) {
	case 1:
		*p = (*p & ~0xffUL) | (unsigned long)(val & 0xff);
		break;
	case 2:
		*p = (*p & ~0xffffUL) | (unsigned long)(val & 0xffff);
		break;
	case 4:
		*p = (unsigned long)(val & 0xffffffffULL);
		break;
	default:
		*p = (unsigned long)val;
		break;
	}
}

u64 ng_operand_value(const struct ng_insn *insn, const struct pt_regs *regs)
{
	if (insn->kind == NG_KIND_STORE_IMM)
		return insn->imm;
	if (insn->reg == NG_REG_NONE)
		return 0;
	return ng_reg_get(regs, insn->reg, insn->mem_width, insn->high8);
}

/* Little-endian load of @n (<= 8) bytes. */
static u64 ng_le(const u8 *p, unsigned int n)
{
	u64 v = 0;

	while (n--)
		v = (v << 8) | p[n];
	return v;
}

/* ------------------------------------------------------------------ */
/* Decoder */

/* Parse ModRM (+SIB, +disp) at buf[pos]; returns the new pos or -EINVAL. */
static int ng_decode_modrm(const u8 *buf, unsigned int avail,
			   unsigned int pos, struct ng_insn *out)
{
	u8 mod, rm, rex = out->rex_bits;
	unsigned int dispsz = 0;

	if (pos >= avail)
		return -EINVAL;
	out->has_modrm = true;
	out->modrm = buf[pos++];
	mod = out->modrm >> 6;
	rm = out->modrm & 7;
	if (mod == 3)
		return -EINVAL;		/* register operand: no memory access */

	out->scale = 1;
	out->index = NG_REG_NONE;
	if (rm == 4) {
		u8 base, index;

		if (pos >= avail)
			return -EINVAL;
		out->has_sib = true;
		out->sib = buf[pos++];
		out->scale = 1 << (out->sib >> 6);
		index = ((out->sib >> 3) & 7) | ((rex & NG_REX_X) ? 8 : 0);
		base = out->sib & 7;
		if (index != NG_REG_SP)
			out->index = index;
		if (base == 5 && mod == 0) {
			out->base = NG_REG_NONE;
			dispsz = 4;
		} else {
			out->base = base | ((rex & NG_REX_B) ? 8 : 0);
		}
	} else if (rm == 5 && mod == 0) {
		out->base = NG_REG_RIP;
		dispsz = 4;
	} else {
		out->base = rm | ((rex & NG_REX_B) ? 8 : 0);
	}
	if (mod == 1)
		dispsz = 1;
	else if (mod == 2)
		dispsz = 4;

	if (dispsz > avail - pos)
		return -EINVAL;
	if (dispsz == 1)
		out->disp = (s8)buf[pos];
	else if (dispsz == 4)
		out->disp = (s32)(u32)ng_le(buf + pos, 4);
	return pos + dispsz;
}

/* Operand size of a 16/32/64-bit form */
static u8 ng_osize(const struct ng_insn *out)
{
	if (out->rex_bits & NG_REX_W)
		return 8;
	return out->opsize ? 2 : 4;
}

/* The immediate of @size bytes at buf[pos], sign-extended to @width. */
static int ng_decode_imm(const u8 *buf, unsigned int avail, unsigned int pos,
			 unsigned int size, unsigned int width, struct ng_insn *out)
{
	if (size > avail - pos)
		return -EINVAL;
	out->imm = ng_sext(ng_le(buf + pos, size), size) & ng_mask(width);
	out->has_imm = true;
	return pos + size;
}

/*
 * The ALU instructions of ng_decode_alu() (opcode @b at buf[pos - 1]):
 * the rest of the instruction into @out, or -EINVAL.
 */
static int ng_decode_alu_op(const u8 *buf, unsigned int avail, unsigned int pos,
			    u8 b, struct ng_insn *out)
{
	unsigned int w = (b & 1) ? ng_osize(out) : 1, ext, immsz = 0;
	int ret;

	out->mem_width = w;
	out->reg_width = w;
	out->kind = NG_KIND_ALU_MEM;
	if (b < 0x40 && (b & 7) < 4) {
		out->alu = b >> 3;
		if (b & 2)
			out->kind = NG_KIND_ALU_REG;
	} else if (b >= 0x80 && b <= 0x83 && b != 0x82) {
		immsz = b == 0x81 ? (w == 2 ? 2 : 4) : 1;
	} else if (b == 0x84 || b == 0x85) {
		out->alu = NG_ALU_TEST;
	} else if (b != 0xf6 && b != 0xf7 && b != 0xfe && b != 0xff) {
		return -EINVAL;
	}
	ret = ng_decode_modrm(buf, avail, pos, out);
	if (ret < 0)
		return ret;
	pos = ret;
	ext = (out->modrm >> 3) & 7;
	if (b >= 0x80 && b <= 0x83) {
		out->alu = ext;
	} else if (b == 0xf6 || b == 0xf7) {
		static const u8 f6[8] = { NG_ALU_TEST, 0xff, NG_ALU_NOT, NG_ALU_NEG,
					  0xff, 0xff, 0xff, 0xff };

		out->alu = f6[ext];
		if (out->alu == 0xff)
			return -EINVAL;	/* test /1 (undocumented), mul, div */
		if (out->alu == NG_ALU_TEST)
			immsz = w == 2 ? 2 : (w == 1 ? 1 : 4);
	} else if (b == 0xfe || b == 0xff) {
		if (ext > 1)
			return -EINVAL;	/* call, jmp, push: not ALU ops */
		out->alu = ext ? NG_ALU_DEC : NG_ALU_INC;
	} else {
		out->reg = ext | ((out->rex_bits & NG_REX_R) ? 8 : 0);
		if (w == 1 && !out->rex && out->reg >= 4)
			out->high8 = true;
	}
	if (immsz) {
		ret = ng_decode_imm(buf, avail, pos, immsz, w, out);
		if (ret < 0)
			return ret;
		pos = ret;
	}
	if (pos > NG_INSN_MAX_LEN)
		return -EINVAL;
	out->len = pos;
	return 0;
}

static int ng_decode_common(const u8 *buf, unsigned int avail, struct ng_insn *out,
			    bool alu)
{
	unsigned int pos = 0, immsz = 0;
	bool f3 = false, twobyte = false;
	int ret;
	u8 b;

	memset(out, 0, sizeof(*out));
	out->reg = NG_REG_NONE;
	out->base = NG_REG_NONE;
	out->index = NG_REG_NONE;
	out->scale = 1;

	if (avail > NG_INSN_MAX_LEN)
		avail = NG_INSN_MAX_LEN;

	/* Prefixes */
	for (;;) {
		if (pos >= avail)
			return -EINVAL;
		b = buf[pos];
		if ((b & 0xf0) == 0x40) {
			/* REX: only counts if the opcode comes next */
			out->rex = true;
			out->rex_bits = b & 0xf;
			pos++;
			continue;
		}
		switch (b) {
		case 0x66:
			out->opsize = true;
			break;
		case 0xf3:
			f3 = true;
			break;
		case 0x2e:
		case 0x36:
		case 0x3e:
		case 0x26:
			out->seg = b;
			break;
		case 0x64:	/* FS, GS: a base we cannot see; single-step */
		case 0x65:
		case 0x67:	/* address size */
		case 0xf0:	/* lock: not atomic as emulated, a read then a write */
		case 0xf2:
			return -EINVAL;
		default:
			goto opcode;
		}
		/* a legacy prefix after a REX: that REX is ignored */
		out->rex = false;
		out->rex_bits = 0;
		pos++;
	}

opcode:
	pos++;
	if (b == 0x0f) {
		if (pos >= avail)
			return -EINVAL;
		b = buf[pos++];
		twobyte = true;
	}
	out->opcode = b;

	if (twobyte) {
		switch (b) {
		case 0xb6:
		case 0xbe:
			out->mem_width = 1;
			break;
		case 0xb7:
		case 0xbf:
			out->mem_width = 2;
			break;
		default:
			return -EINVAL;
		}
		out->kind = (b == 0xb6 || b == 0xb7) ? NG_KIND_MOVZX :
						       NG_KIND_MOVSX;
		out->reg_width = ng_osize(out);
	} else {
		switch (b) {
		case 0x88:
		case 0x8a:
			out->kind = b == 0x88 ? NG_KIND_STORE : NG_KIND_LOAD;
			out->mem_width = 1;
			out->reg_width = 1;
			break;
		case 0x89:
		case 0x8b:
			out->kind = b == 0x89 ? NG_KIND_STORE : NG_KIND_LOAD;
			out->mem_width = ng_osize(out);
			out->reg_width = out->mem_width;
			break;
		case 0x63:
			/* movsxd without REX.W: rare, murky; single-step it */
			if (!(out->rex_bits & NG_REX_W))
				return -EINVAL;
			out->kind = NG_KIND_MOVSX;
			out->mem_width = 4;
			out->reg_width = 8;
			break;
		case 0xc6:
			out->kind = NG_KIND_STORE_IMM;
			out->mem_width = 1;
			immsz = 1;
			break;
		case 0xc7:
			out->kind = NG_KIND_STORE_IMM;
			out->mem_width = ng_osize(out);
			immsz = out->mem_width == 2 ? 2 : 4;
			break;
		case 0xa4:
		case 0xa5:
			out->kind = NG_KIND_MOVS;
			break;
		case 0xaa:
		case 0xab:
			out->kind = NG_KIND_STOS;
			out->reg = NG_REG_AX;
			break;
		default:
			if (!alu || f3)
				return -EINVAL;
			return ng_decode_alu_op(buf, avail, pos, b, out);
		}
	}

	if (out->kind == NG_KIND_MOVS || out->kind == NG_KIND_STOS) {
		out->mem_width = (b & 1) ? ng_osize(out) : 1;
		if (out->kind == NG_KIND_STOS)
			out->reg_width = out->mem_width;
		out->rep = f3;
		out->len = pos;
		return 0;
	}
	if (f3)
		return -EINVAL;	/* F3 on anything but movs/stos */

	ret = ng_decode_modrm(buf, avail, pos, out);
	if (ret < 0)
		return ret;
	pos = ret;

	if (out->kind == NG_KIND_STORE_IMM) {
		/* C6/C7 /0 only (C6 F8 and C7 F8 are xabort/xbegin) */
		if (out->modrm & 0x38)
			return -EINVAL;
		if (immsz > avail - pos)
			return -EINVAL;
		out->imm = ng_le(buf + pos, immsz);
		if (out->mem_width == 8)
			out->imm = ng_sext(out->imm, 4);
		pos += immsz;
	} else {
		out->reg = ((out->modrm >> 3) & 7) |
			   ((out->rex_bits & NG_REX_R) ? 8 : 0);
		if (out->reg_width == 1 && !out->rex && out->reg >= 4)
			out->high8 = true;
	}
	out->len = pos;
	return 0;
}

int ng_decode(const u8 *buf, unsigned int avail, struct ng_insn *out)
{
	return ng_decode_common(buf, avail, out, false);
}

int ng_decode_alu(const u8 *buf, unsigned int avail, struct ng_insn *out)
{
	return ng_decode_common(buf, avail, out, true);
}

bool ng_alu_writes(const struct ng_insn *insn)
{
	return insn->kind == NG_KIND_ALU_MEM && insn->alu != NG_ALU_CMP &&
	       insn->alu != NG_ALU_TEST;
}

unsigned long ng_modrm_ea(const struct ng_insn *insn,
			  const struct pt_regs *regs)
{
	unsigned long ea;

	if (!insn->has_modrm)
		return 0;
	ea = (unsigned long)(long)insn->disp;
	if (insn->base == NG_REG_RIP)
		ea += regs->ip + insn->len;
	else if (insn->base != NG_REG_NONE)
		ea += ng_gpr_val(regs, insn->base);
	if (insn->index != NG_REG_NONE)
		ea += ng_gpr_val(regs, insn->index) * insn->scale;
	return ea;
}

/* ------------------------------------------------------------------ */
/* Emulator */

static bool ng_valid_width(unsigned int w)
{
	return w == 1 || w == 2 || w == 4 || w == 8;
}

/* Is @fault_addr within the @width bytes at @addr? */
static bool ng_covers(unsigned long addr, unsigned int width,
		      unsigned long fault_addr)
{
	return fault_addr - addr < width;
}

static void ng_op_done(const struct ng_mem_ops *ops, void *ctx,
		       unsigned long addr, unsigned int width, u8 op, u64 val,
		       u64 elem)
{
	struct ng_access acc;

	if (!ops->access)
		return;
	acc.addr = addr;
	acc.value = val;
	acc.elem = elem;
	acc.width = width;
	acc.op = op;
	ops->access(ctx, &acc);
}

static int ng_do_read(const struct ng_mem_ops *ops, void *ctx,
		      unsigned long addr, unsigned int width, u64 elem,
		      u64 *val)
{
	int ret;

	*val = 0;
	ret = ops->read(ctx, addr, width, val);
	if (ret)
		return ret;
	*val &= ng_mask(width);
	ng_op_done(ops, ctx, addr, width, NG_OP_READ, *val, elem);
	return 0;
}

static int ng_do_write(const struct ng_mem_ops *ops, void *ctx,
		       unsigned long addr, unsigned int width, u64 elem,
		       u64 val)
{
	int ret;

	val &= ng_mask(width);
	ret = ops->write(ctx, addr, width, val);
	if (ret)
		return ret;
	ng_op_done(ops, ctx, addr, width, NG_OP_WRITE, val, elem);
	return 0;
}

static int ng_emulate_string(const struct ng_insn *insn,
			     struct pt_regs *regs, unsigned long fault_addr,
			     const struct ng_mem_ops *ops, void *ctx,
			     unsigned long max_elems)
{
	unsigned int w = insn->mem_width;
	unsigned long step = (regs->flags & NG_FLAGS_DF) ? -(unsigned long)w : w;
	unsigned long count = insn->rep ? regs->cx : 1;
	bool movs = insn->kind == NG_KIND_MOVS;
	unsigned long n;
	u64 val;
	int ret;

	if (!count) {
		regs->ip += insn->len;
		return 0;
	}
	if (!ng_covers(regs->di, w, fault_addr) &&
	    !(movs && ng_covers(regs->si, w, fault_addr)))
		return -EFAULT;

	for (n = 0; n < count; n++) {
		if (max_elems && n == max_elems)
			return NG_EMU_PARTIAL;
		if (movs) {
			ret = ng_do_read(ops, ctx, regs->si, w, n, &val);
			if (ret)
				return ret;
		} else {
			val = regs->ax;
		}
		ret = ng_do_write(ops, ctx, regs->di, w, n, val);
		if (ret)
			return ret;
		if (movs)
			regs->si += step;
		regs->di += step;
		if (insn->rep)
			regs->cx--;
	}
	regs->ip += insn->len;
	return 0;
}

/* PF: the low byte of @r has an even number of bits set */
static unsigned long ng_parity(u64 r)
{
	u8 b = r;

	b ^= b >> 4;
	b ^= b >> 2;
	b ^= b >> 1;
	return (b & 1) ? 0 : 0x004;
}

/*
 * @a op @b in @width bytes (cf: the carry in, for adc, sbb), as the CPU
 * does: the result, and the arithmetic flags in *@flags (all six; the
 * caller keeps the ones the instruction does not change).
 */
static u64 ng_alu_compute(u8 op, unsigned int width, u64 a, u64 b, bool cf,
			  unsigned long *flags)
{
	u64 msb = 1ULL << (width * 8 - 1), mask = ng_mask(width), r;
	unsigned long f = 0;
	bool sub = false;

	a &= mask;
	b &= mask;
	switch (op) {
	case NG_ALU_ADD:
	case NG_ALU_INC:
		cf = false;
		fallthrough;
	case NG_ALU_ADC:
		r = (a + b + cf) & mask;
		if (r < a || (cf && r == a))
			f |= NG_FLAGS_CF;
		if ((a ^ r) & (b ^ r) & msb)
			f |= 0x800;
		break;
	case NG_ALU_SUB:
	case NG_ALU_CMP:
	case NG_ALU_DEC:
	case NG_ALU_NEG:
		cf = false;
		fallthrough;
	case NG_ALU_SBB:
		r = (a - b - cf) & mask;
		if (a < b || (cf && a == b))
			f |= NG_FLAGS_CF;
		if ((a ^ b) & (a ^ r) & msb)
			f |= 0x800;
		sub = true;
		break;
	case NG_ALU_OR:
		r = a | b;
		break;
	case NG_ALU_XOR:
		r = a ^ b;
		break;
	default:	/* AND, TEST */
		r = a & b;
		break;
	}
	if (sub || op == NG_ALU_ADD || op == NG_ALU_ADC || op == NG_ALU_INC)
		f |= (a ^ b ^ r) & 0x010;	/* AF */
	f |= ng_parity(r);
	if (!r)
		f |= 0x040;
	if (r & msb)
		f |= 0x080;
	*flags = f;
	return r;
}

/*
 * An ALU op of ng_decode_alu() whose memory operand is at @ea, read:
 * @val.  The value it writes back into memory (*@store, true) or into
 * its register, and the flags it sets, into @regs.
 */
static u64 ng_alu_result(const struct ng_insn *insn, struct pt_regs *regs,
			 u64 val, bool *store)
{
	unsigned int w = insn->mem_width;
	unsigned long keep = NG_FLAGS_ARITH, f = 0;
	u64 other = insn->has_imm ? insn->imm :
		    insn->reg == NG_REG_NONE ? 0 :
		    ng_reg_get(regs, insn->reg, insn->reg_width, insn->high8);
	bool cf = regs->flags & NG_FLAGS_CF;
	u64 r;

	*store = ng_alu_writes(insn);
	switch (insn->alu) {
	case NG_ALU_NOT:
		return ~val & ng_mask(w);
	case NG_ALU_NEG:
		r = ng_alu_compute(NG_ALU_NEG, w, 0, val, false, &f);
		break;
	case NG_ALU_INC:
	case NG_ALU_DEC:
		r = ng_alu_compute(insn->alu, w, val, 1, false, &f);
		keep = NG_FLAGS_ARITH & ~NG_FLAGS_CF;
		break;
	default:
		if (insn->kind == NG_KIND_ALU_REG)
			r = ng_alu_compute(insn->alu, w, other, val, cf, &f);
		else
			r = ng_alu_compute(insn->alu, w, val, other, cf, &f);
		if (insn->kind == NG_KIND_ALU_REG && insn->alu != NG_ALU_CMP)
			ng_reg_set(regs, insn->reg, insn->reg_width, insn->high8, r);
		break;
	}
	regs->flags = (regs->flags & ~keep) | (f & keep);
	return r;
}

static int ng_emulate_alu(const struct ng_insn *insn, struct pt_regs *regs,
			  unsigned long fault_addr, const struct ng_mem_ops *ops,
			  void *ctx)
{
	unsigned int w = insn->mem_width;
	unsigned long ea = ng_modrm_ea(insn, regs);
	struct pt_regs after = *regs;
	bool store;
	u64 val, r;
	int ret;

	if (!insn->has_modrm || insn->alu > NG_ALU_DEC ||
	    (!insn->has_imm && insn->alu != NG_ALU_NOT && insn->alu != NG_ALU_NEG &&
	     insn->alu != NG_ALU_INC && insn->alu != NG_ALU_DEC && insn->reg > 15))
		return -EINVAL;
	if (!ng_covers(ea, w, fault_addr))
		return -EFAULT;
	ret = ng_do_read(ops, ctx, ea, w, 0, &val);
	if (ret)
		return ret;
	r = ng_alu_result(insn, &after, val, &store);
	if (store) {
		ret = ng_do_write(ops, ctx, ea, w, 0, r);
		if (ret)
			return ret;
	}
	*regs = after;
	regs->ip += insn->len;
	return 0;
}

bool ng_plain_move(const struct ng_insn *insn)
{
	switch (insn->kind) {
	case NG_KIND_LOAD:
	case NG_KIND_STORE:
	case NG_KIND_STORE_IMM:
	case NG_KIND_MOVZX:
	case NG_KIND_MOVSX:
		break;
	default:
		return false;
	}
	if (!ng_valid_width(insn->mem_width) || insn->len == 0 ||
	    insn->len > NG_INSN_MAX_LEN || !insn->has_modrm)
		return false;
	return insn->kind == NG_KIND_STORE_IMM ||
	       (insn->reg <= 15 && ng_valid_width(insn->reg_width));
}

u64 ng_store_value(const struct ng_insn *insn, const struct pt_regs *regs)
{
	u64 val = insn->kind == NG_KIND_STORE_IMM ? insn->imm :
		  ng_reg_get(regs, insn->reg, insn->reg_width, insn->high8);

	return val & ng_mask(insn->mem_width);
}

void ng_load_result(const struct ng_insn *insn, struct pt_regs *regs, u64 val)
{
	if (insn->kind == NG_KIND_MOVSX)
		val = ng_sext(val, insn->mem_width);
	ng_reg_set(regs, insn->reg, insn->reg_width, insn->high8, val);
}

int ng_emulate(const struct ng_insn *insn, struct pt_regs *regs,
	       unsigned long fault_addr, const struct ng_mem_ops *ops,
	       void *ctx, unsigned long max_elems)
{
	unsigned int w = insn->mem_width;
	unsigned long ea;
	u64 val;
	int ret;

	if (!ng_valid_width(w) || insn->len == 0 ||
	    insn->len > NG_INSN_MAX_LEN)
		return -EINVAL;
	if (insn->kind == NG_KIND_MOVS || insn->kind == NG_KIND_STOS)
		return ng_emulate_string(insn, regs, fault_addr, ops, ctx,
					 max_elems);
	if (insn->kind == NG_KIND_ALU_MEM || insn->kind == NG_KIND_ALU_REG)
		return ng_emulate_alu(insn, regs, fault_addr, ops, ctx);
	if (!ng_plain_move(insn))
		return -EINVAL;

	ea = ng_modrm_ea(insn, regs);
	if (!ng_covers(ea, w, fault_addr))
		return -EFAULT;

	if (insn->kind == NG_KIND_STORE || insn->kind == NG_KIND_STORE_IMM) {
		ret = ng_do_write(ops, ctx, ea, w, 0, ng_store_value(insn, regs));
	} else {
		/* LOAD, MOVZX, MOVSX */
		ret = ng_do_read(ops, ctx, ea, w, 0, &val);
		if (!ret)
			ng_load_result(insn, regs, val);
	}
	if (ret)
		return ret;
	regs->ip += insn->len;
	return 0;
}

/* ------------------------------------------------------------------ */
/* What the kernel's mmiotrace (arch/x86/mm/pf_in.c, x86-64) reports */

/* Its prefix list, apart from REX 40-4F */
static bool ng_compat_prefix(u8 b)
{
	switch (b) {
	case 0x66: case 0x67: case 0x2e: case 0x3e: case 0x26: case 0x64:
	case 0x65: case 0x36: case 0xf0: case 0xf3: case 0xf2:
		return true;
	default:
		return false;
	}
}

int ng_compat_plan(const u8 *insn, unsigned int avail, struct ng_compat_plan *p)
{
	bool opsz = false, rexw = false, rexr = false, rex = false;
	unsigned int pos = 0, opc, regw, regno;
	u8 b, modrm;

	p->op = NG_OP_UNKNOWN;
	p->width = 0;
	p->reg = NG_COMPAT_CONST;
	p->value = 0;
	/* Any run of prefixes; REX bits accumulate */
	for (;;) {
		if (pos >= avail)
			return -EINVAL;
		b = insn[pos];
		if ((b & 0xf0) == 0x40) {
			rex = true;
			if (b & NG_REX_W)
				rexw = true;
			if (b & NG_REX_R)
				rexr = true;
		} else if (b == 0x66) {
			opsz = true;
		} else if (!ng_compat_prefix(b)) {
			break;
		}
		pos++;
	}
	/* The opcode: one byte, or 0F and the next */
	if (b == 0x0f) {
		if (avail - pos < 2)
			return -EINVAL;
		opc = 0x0f00 | insn[pos + 1];
		pos += 2;
	} else {
		opc = b;
		pos++;
	}

	/* Its register width (66 wins over REX.W) */
	if (opc == 0x88 || opc == 0x8a || opc == 0xaa || opc == 0xc6)
		regw = 1;
	else
		regw = opsz ? 2 : (rexw ? 8 : 4);

	/* Its memory width */
	switch (opc) {
	case 0x88: case 0x8a: case 0xaa: case 0xc6: case 0x0fb6: case 0x0fbe:
		p->width = 1;
		break;
	case 0x0fb7: case 0x0fbf:
		p->width = 2;
		break;
	case 0xc7:
		p->width = opsz ? 2 : 4;	/* REX.W ignored */
		break;
	case 0x89: case 0x8b: case 0xab:
		p->width = regw;
		break;
	default:
		/* unknown: the first three bytes, whatever they are */
		if (avail < 3)
			return -EINVAL;
		p->value = ((u64)insn[0] << 16) | ((u64)insn[1] << 8) | insn[2];
		return 0;
	}

	if (opc == 0xc6 || opc == 0xc7) {
		/* ModRM, then a displacement; a SIB byte is not skipped */
		if (pos >= avail)
			goto einval;
		modrm = insn[pos++];
		if ((modrm >> 6) == 1)
			pos += 1;
		else if ((modrm >> 6) == 2 || (modrm & 0xc7) == 0x05)
			pos += 4;
		if (pos > avail || regw > avail - pos)
			goto einval;
		p->op = NG_OP_WRITE;
		p->value = ng_le(insn + pos, regw);
		return 0;
	}

	if (opc == 0xaa || opc == 0xab) {
		regno = NG_REG_AX;	/* stos: no ModRM read */
	} else {
		if (pos >= avail)
			goto einval;
		regno = ((insn[pos] >> 3) & 7) | (rexr ? 8 : 0);
	}
	p->op = (opc == 0x88 || opc == 0x89 || opc == 0xaa || opc == 0xab) ?
		NG_OP_WRITE : NG_OP_READ;
	if (regw == 1 && !rex && regno >= 4) {
		p->reg = regno - 4;
		p->high8 = true;
		p->value = 0xff;
	} else {
		p->reg = regno;
		p->high8 = false;
		p->value = ng_mask(regw);
	}
	return 0;
einval:
	p->width = 0;
	return -EINVAL;
}

u64 ng_compat_value(const struct ng_compat_plan *p, const struct pt_regs *regs)
{
	if (p->reg == NG_COMPAT_CONST)
		return p->value;
	if (!regs)
		return 0;
	return (ng_gpr_val(regs, p->reg) >> (p->high8 ? 8 : 0)) & p->value;
}

int ng_compat(const u8 *insn, unsigned int avail, const struct pt_regs *regs,
	      u8 *op, u8 *width, u64 *value)
{
	struct ng_compat_plan p;
	int ret = ng_compat_plan(insn, avail, &p);

	if (ret)
		return ret;
	*op = p.op;
	*width = p.width;
	*value = ng_compat_value(&p, regs);
	return 0;
}
