// SPDX-License-Identifier: GPL-2.0
/*
 * Host harness for kmod/ng_decode.c, driven by tests/unit/test_decode.py
 * over stdin/stdout: one command a line, one answer line each.
 *
 * Build: gcc -Wall -Wextra -Werror -DNG_DECODE_HOST -I kmod \
 *            tests/unit/decode_harness.c kmod/ng_decode.c
 * With -DNG_ORACLE_PF_IN='"/path/arch/x86/mm/pf_in.c"' and -I a directory
 * holding an empty linux/ptrace.h, the kernel's own pf_in.c is compiled in
 * as the oracle for ng_compat() (command K).
 *
 * Instruction bytes are always copied to the end of a page followed by an
 * inaccessible page, so reading past them faults; a fault is caught and
 * answered as "SEGV" (or "FAULT" for K, where it is an expected result).
 *
 * Numbers are hex without 0x; "-" is an empty byte string or no registers.
 * Registers (18, comma-separated): ax cx dx bx sp bp si di r8..r15 ip flags.
 *
 * D <bytes>              decode:  "<rc> <len> <kind> <opcode> <mem_width>
 *                        <reg_width> <reg> <high8> <rex> <rex_bits> <opsize>
 *                        <rep> <seg> <has_modrm> <modrm> <has_sib> <sib>
 *                        <base> <index> <scale> <disp> <imm>" (rc only if <0)
 * T <bytes>              decode with every avail 0..n: "<rc>/<len> ..."
 * A <bytes> <regs>       decode, then ng_modrm_ea(): "<rc> <ea>"
 * E <bytes> <fault> <max> <failat> <regs> <mem>
 *                        emulate; mem: "base:bytes,..." or "-"; failat: the
 *                        1-based ops call that fails with -ENXIO (0: none)
 *                        "<rc> <regs> <mem> <ops log> <callback log>"
 *                        ops log:  "R@addr:width:value;W@..." or "-"
 *                        callback: "r@addr:width:value:elem;w@..." or "-"
 * C <bytes> <regs>       ng_compat(): "<rc> <op> <width> <value>"
 * N <bytes>              the least avail for which ng_compat() succeeds,
 *                        checking that every larger one gives the same:
 *                        "<n>" / "-1" / "MISMATCH <avail>"
 * K <bytes> <regs>       the kernel's pf_in.c as pre()/post() use it:
 *                        "<op> <width> <value> <printks>", "FAULT", or
 *                        "NOORACLE"
 * LD, LT, LE             D, T, E with ng_decode_alu() for ng_decode()
 * B                      the CPU's page (always at 5a0000000): "<code address>
 *                        <data address>"
 * X <bytes> <regs> <mem> the instruction run by this CPU, at the code
 *                        address (give it as ip), on mem (one region,
 *                        in the data area, rsp not used): "<regs> <mem>"
 *                        (ip as given, flags: the arithmetic ones)
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ng_decode.h"

#ifdef NG_ORACLE_PF_IN
static int oracle_printks;

#define KERN_ERR ""
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
static int printk(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int printk(const char *fmt, ...)
{
	(void)fmt;
	oracle_printks++;
	return 0;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#include NG_ORACLE_PF_IN
#pragma GCC diagnostic pop
#endif

#define MAXBYTES 64
#define NREGS 18
#define MAXREGIONS 4
#define MAXREGION 8192
#define MAXLOG 4096

static int use_alu;		/* L commands: ng_decode_alu() */
static u8 *guard_page;		/* the page before the inaccessible one */
static long page_size;
static sigjmp_buf segv_env;
static volatile sig_atomic_t segv_armed;

static void on_segv(int sig)
{
	if (!segv_armed) {
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	segv_armed = 0;
	siglongjmp(segv_env, 1);
}

/* Copy n bytes so that they end right before the inaccessible page. */
static const u8 *place(const u8 *bytes, unsigned int n)
{
	u8 *p = guard_page + page_size - n;

	memcpy(p, bytes, n);
	return p;
}

static int parse_hex(const char *s, u8 *out, unsigned int max)
{
	unsigned int n = 0;

	if (!strcmp(s, "-"))
		return 0;
	while (s[0] && s[1]) {
		unsigned int v;

		if (n >= max || sscanf(s, "%2x", &v) != 1)
			return -1;
		out[n++] = v;
		s += 2;
	}
	return s[0] ? -1 : (int)n;
}

static unsigned long *reg_slot(struct pt_regs *r, int i)
{
	unsigned long *slots[NREGS] = {
		&r->ax, &r->cx, &r->dx, &r->bx, &r->sp, &r->bp, &r->si, &r->di,
		&r->r8, &r->r9, &r->r10, &r->r11, &r->r12, &r->r13, &r->r14,
		&r->r15, &r->ip, &r->flags,
	};
	return slots[i];
}

static int parse_regs(const char *s, struct pt_regs *r)
{
	int i;

	memset(r, 0, sizeof(*r));
	for (i = 0; i < NREGS; i++) {
		char *end;

		*reg_slot(r, i) = strtoul(s, &end, 16);
		if (end == s)
			return -1;
		s = end;
		if (i < NREGS - 1) {
			if (*s != ',')
				return -1;
			s++;
		}
	}
	return *s ? -1 : 0;
}

static void print_regs(struct pt_regs *r)
{
	int i;

	for (i = 0; i < NREGS; i++)
		printf("%s%lx", i ? "," : "", *reg_slot(r, i));
}

/* ---------------------------------------------------------------- */
/* Memory model for E */

struct region {
	unsigned long base;
	unsigned int len;
	u8 data[MAXREGION];
};

struct emu_ctx {
	struct region regions[MAXREGIONS];
	int nregions;
	unsigned int calls;
	unsigned int failat;
	char ops_log[MAXLOG];
	char cb_log[MAXLOG];
	int bad;		/* a width other than 1/2/4/8 was asked for */
};

static void log_append(char *log, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void log_append(char *log, const char *fmt, ...)
{
	size_t used = strlen(log);
	va_list ap;

	if (used >= MAXLOG - 1)
		return;
	va_start(ap, fmt);
	vsnprintf(log + used, MAXLOG - used, fmt, ap);
	va_end(ap);
}

static u8 *find_mem(struct emu_ctx *c, unsigned long addr, unsigned int width)
{
	int i;

	for (i = 0; i < c->nregions; i++) {
		struct region *r = &c->regions[i];

		if (addr - r->base < r->len && r->len - (addr - r->base) >= width)
			return r->data + (addr - r->base);
	}
	return NULL;
}

static int mem_read(void *ctx, unsigned long addr, unsigned int width, u64 *val)
{
	struct emu_ctx *c = ctx;
	u8 *p;
	unsigned int i;

	if (width != 1 && width != 2 && width != 4 && width != 8)
		c->bad = 1;
	if (++c->calls == c->failat)
		return -ENXIO;
	p = find_mem(c, addr, width);
	if (!p)
		return -EIO;
	*val = 0;
	for (i = 0; i < width; i++)
		*val |= (u64)p[i] << (8 * i);
	log_append(c->ops_log, "R@%lx:%u:%llx;", addr, width, *val);
	return 0;
}

static int mem_write(void *ctx, unsigned long addr, unsigned int width, u64 val)
{
	struct emu_ctx *c = ctx;
	u8 *p;
	unsigned int i;

	if (width != 1 && width != 2 && width != 4 && width != 8)
		c->bad = 1;
	if (width < 8 && (val >> (8 * width)))
		c->bad = 1;
	if (++c->calls == c->failat)
		return -ENXIO;
	p = find_mem(c, addr, width);
	if (!p)
		return -EIO;
	for (i = 0; i < width; i++)
		p[i] = val >> (8 * i);
	log_append(c->ops_log, "W@%lx:%u:%llx;", addr, width, val);
	return 0;
}

static void mem_access(void *ctx, const struct ng_access *a)
{
	struct emu_ctx *c = ctx;

	log_append(c->cb_log, "%c@%lx:%u:%llx:%llx;",
		   a->op == NG_OP_READ ? 'r' : (a->op == NG_OP_WRITE ? 'w' : '?'),
		   a->addr, a->width, a->value, a->elem);
}

static const struct ng_mem_ops harness_ops = {
	.read = mem_read,
	.write = mem_write,
	.access = mem_access,
};

static int parse_mem(char *s, struct emu_ctx *c)
{
	char *tok, *save = NULL;

	c->nregions = 0;
	if (!strcmp(s, "-"))
		return 0;
	for (tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		struct region *r;
		char *colon = strchr(tok, ':');
		int n;

		if (!colon || c->nregions >= MAXREGIONS)
			return -1;
		*colon = 0;
		r = &c->regions[c->nregions++];
		r->base = strtoul(tok, NULL, 16);
		n = parse_hex(colon + 1, r->data, MAXREGION);
		if (n < 0)
			return -1;
		r->len = n;
	}
	return 0;
}

static int decode(const u8 *buf, unsigned int avail, struct ng_insn *in)
{
	return use_alu ? ng_decode_alu(buf, avail, in) : ng_decode(buf, avail, in);
}

/* ---------------------------------------------------------------- */
/* The CPU itself (X): the instruction then a ret, called with every
 * register but rsp loaded from cpu_st and saved back there after. */

#define CPU_PAGE 4096
#define CPU_DATA 2048		/* the data area: the page's second half */
#define CPU_ADDR 0x5a0000000UL	/* where the page is (B says it too) */

struct cpu_state {
	unsigned long r[16];	/* ax cx dx bx sp bp si di r8..r15 */
	unsigned long flags;
};

struct cpu_state cpu_st;
void *cpu_code;
static u8 *cpu_page;
void cpu_run(void);

#define CPU_LOAD(n, reg) "	mov cpu_st+" #n "(%rip), %" reg "\n"
#define CPU_SAVE(n, reg) "	mov %" reg ", cpu_st+" #n "(%rip)\n"
asm(".text\n"
    ".globl cpu_run\n"
    "cpu_run:\n"
    "	push %rbx\n	push %rbp\n	push %r12\n	push %r13\n	push %r14\n	push %r15\n"
    "	pushq cpu_st+128(%rip)\n"
    "	popfq\n"
    CPU_LOAD(0, "rax") CPU_LOAD(8, "rcx") CPU_LOAD(16, "rdx") CPU_LOAD(24, "rbx")
    CPU_LOAD(40, "rbp") CPU_LOAD(48, "rsi") CPU_LOAD(56, "rdi") CPU_LOAD(64, "r8")
    CPU_LOAD(72, "r9") CPU_LOAD(80, "r10") CPU_LOAD(88, "r11") CPU_LOAD(96, "r12")
    CPU_LOAD(104, "r13") CPU_LOAD(112, "r14") CPU_LOAD(120, "r15")
    "	call *cpu_code(%rip)\n"
    "	pushfq\n"
    "	popq cpu_st+128(%rip)\n"
    CPU_SAVE(0, "rax") CPU_SAVE(8, "rcx") CPU_SAVE(16, "rdx") CPU_SAVE(24, "rbx")
    CPU_SAVE(40, "rbp") CPU_SAVE(48, "rsi") CPU_SAVE(56, "rdi") CPU_SAVE(64, "r8")
    CPU_SAVE(72, "r9") CPU_SAVE(80, "r10") CPU_SAVE(88, "r11") CPU_SAVE(96, "r12")
    CPU_SAVE(104, "r13") CPU_SAVE(112, "r14") CPU_SAVE(120, "r15")
    "	pop %r15\n	pop %r14\n	pop %r13\n	pop %r12\n	pop %rbp\n	pop %rbx\n"
    "	cld\n"
    "	ret\n");

static void cmd_cpu(const u8 *bytes, int n, const char *regs_s, char *mem_s)
{
	unsigned long base;
	struct pt_regs regs;
	char *colon = strchr(mem_s, ':');
	u8 data[CPU_PAGE - CPU_DATA];
	int i, len;

	if (parse_regs(regs_s, &regs) || !colon || n > CPU_DATA - 1) {
		printf("BADARGS");
		return;
	}
	*colon = 0;
	base = strtoul(mem_s, NULL, 16);
	len = parse_hex(colon + 1, data, sizeof(data));
	if (len < 0 || base - (unsigned long)(cpu_page + CPU_DATA) > sizeof(data) - len ||
	    regs.ip != (unsigned long)cpu_page) {
		printf("BADARGS");
		return;
	}
	memcpy(cpu_page, bytes, n);
	cpu_page[n] = 0xc3;	/* ret */
	memcpy((u8 *)base, data, len);
	for (i = 0; i < 16; i++)
		cpu_st.r[i] = *reg_slot(&regs, i);
	cpu_st.flags = (regs.flags & NG_FLAGS_ARITH) | 0x202;
	cpu_code = cpu_page;
	cpu_run();
	for (i = 0; i < 16; i++)
		if (i != NG_REG_SP)
			*reg_slot(&regs, i) = cpu_st.r[i];
	regs.flags = cpu_st.flags & NG_FLAGS_ARITH;
	print_regs(&regs);
	printf(" %lx:", base);
	for (i = 0; i < len; i++)
		printf("%02x", ((u8 *)base)[i]);
}

/* ---------------------------------------------------------------- */
/* Commands */

static void cmd_decode(const u8 *bytes, int n)
{
	struct ng_insn in;
	int rc = decode(place(bytes, n), n, &in);

	if (rc) {
		printf("%d", rc);
		return;
	}
	printf("0 %u %u %x %u %u %u %u %u %x %u %u %x %u %x %u %x %u %u %u %d %llx",
	       in.len, in.kind, in.opcode, in.mem_width, in.reg_width, in.reg,
	       in.high8, in.rex, in.rex_bits, in.opsize, in.rep, in.seg,
	       in.has_modrm, in.modrm, in.has_sib, in.sib, in.base, in.index,
	       in.scale, in.disp, in.imm);
}

static void cmd_truncate(const u8 *bytes, int n)
{
	struct ng_insn in;
	int avail, rc;

	for (avail = 0; avail <= n; avail++) {
		rc = decode(place(bytes, avail), avail, &in);
		printf("%s%d/%u", avail ? " " : "", rc, rc ? 0 : in.len);
	}
}

static void cmd_ea(const u8 *bytes, int n, const char *regs_s)
{
	struct pt_regs regs;
	struct ng_insn in;
	int rc;

	if (parse_regs(regs_s, &regs)) {
		printf("BADREGS");
		return;
	}
	rc = decode(place(bytes, n), n, &in);
	printf("%d %lx", rc, rc ? 0UL : ng_modrm_ea(&in, &regs));
}

static struct emu_ctx emu;

static void cmd_emulate(const u8 *bytes, int n, char **args)
{
	struct pt_regs regs;
	struct ng_insn in;
	unsigned long fault, max;
	int rc, i;

	memset(&emu, 0, sizeof(emu));
	fault = strtoul(args[0], NULL, 16);
	max = strtoul(args[1], NULL, 16);
	emu.failat = strtoul(args[2], NULL, 16);
	if (parse_regs(args[3], &regs) || parse_mem(args[4], &emu)) {
		printf("BADARGS");
		return;
	}
	rc = decode(place(bytes, n), n, &in);
	if (rc) {
		printf("DECODE %d", rc);
		return;
	}
	rc = ng_emulate(&in, &regs, fault, &harness_ops, &emu, max);
	if (emu.bad) {
		printf("BADWIDTH");
		return;
	}
	printf("%d ", rc);
	print_regs(&regs);
	printf(" ");
	if (!emu.nregions)
		printf("-");
	for (i = 0; i < emu.nregions; i++) {
		unsigned int j;

		printf("%s%lx:", i ? "," : "", emu.regions[i].base);
		for (j = 0; j < emu.regions[i].len; j++)
			printf("%02x", emu.regions[i].data[j]);
	}
	printf(" %s %s", emu.ops_log[0] ? emu.ops_log : "-",
	       emu.cb_log[0] ? emu.cb_log : "-");
}

static void cmd_compat(const u8 *bytes, int n, const char *regs_s)
{
	struct pt_regs regs;
	u8 op = 0xff, width = 0xff;
	u64 value = 0;
	int rc;

	if (strcmp(regs_s, "-") && parse_regs(regs_s, &regs)) {
		printf("BADREGS");
		return;
	}
	rc = ng_compat(place(bytes, n), n, strcmp(regs_s, "-") ? &regs : NULL,
		       &op, &width, &value);
	printf("%d %u %u %llx", rc, op, width, value);
}

static void cmd_compat_need(const u8 *bytes, int n)
{
	u8 op, width, op0 = 0, width0 = 0;
	u64 value, value0 = 0;
	int avail, least = -1;
	struct pt_regs regs;

	memset(&regs, 0x5a, sizeof(regs));
	for (avail = 0; avail <= n; avail++) {
		int rc = ng_compat(place(bytes, avail), avail, &regs, &op,
				   &width, &value);

		if (least < 0 && rc == 0) {
			least = avail;
			op0 = op;
			width0 = width;
			value0 = value;
		} else if (least >= 0 && (rc || op != op0 || width != width0 ||
					  value != value0)) {
			printf("MISMATCH %d", avail);
			return;
		}
	}
	printf("%d", least);
}

static void cmd_kernel(const u8 *bytes, int n, const char *regs_s)
{
#ifdef NG_ORACLE_PF_IN
	struct pt_regs regs;
	unsigned long ip;
	enum reason_type type;
	unsigned int op, width = 0;
	unsigned long value = 0;

	if (parse_regs(regs_s, &regs)) {
		printf("BADREGS");
		return;
	}
	ip = (unsigned long)place(bytes, n);
	oracle_printks = 0;
	segv_armed = 1;
	if (sigsetjmp(segv_env, 1)) {
		printf("FAULT");
		return;
	}
	/* what mmio-mod.c pre() and post() do */
	type = get_ins_type(ip);
	switch (type) {
	case REG_READ:
		op = NG_OP_READ;
		width = get_ins_mem_width(ip);
		value = get_ins_reg_val(ip, &regs);	/* post() */
		break;
	case REG_WRITE:
		op = NG_OP_WRITE;
		width = get_ins_mem_width(ip);
		value = get_ins_reg_val(ip, &regs);
		break;
	case IMM_WRITE:
		op = NG_OP_WRITE;
		width = get_ins_mem_width(ip);
		value = get_ins_imm_val(ip);
		break;
	default:
		{
			unsigned char *p = (unsigned char *)ip;

			op = NG_OP_UNKNOWN;
			width = 0;
			value = (*p) << 16 | *(p + 1) << 8 | *(p + 2);
		}
	}
	segv_armed = 0;
	printf("%u %u %lx %d", op, width, value, oracle_printks);
#else
	(void)bytes;
	(void)n;
	(void)regs_s;
	printf("NOORACLE");
#endif
}

static void dispatch(int argc, char **argv)
{
	u8 bytes[MAXBYTES];
	int n;

	use_alu = argv[0][0] == 'L' && argv[0][1];
	if (use_alu)
		argv[0]++;
	if (!strcmp(argv[0], "B") && argc == 1) {
		printf("%lx %lx", (unsigned long)cpu_page, (unsigned long)(cpu_page + CPU_DATA));
		return;
	}
	n = argc > 1 ? parse_hex(argv[1], bytes, MAXBYTES) : -1;
	if (n < 0)
		printf("BADBYTES");
	else if (!strcmp(argv[0], "D") && argc == 2)
		cmd_decode(bytes, n);
	else if (!strcmp(argv[0], "T") && argc == 2)
		cmd_truncate(bytes, n);
	else if (!strcmp(argv[0], "A") && argc == 3)
		cmd_ea(bytes, n, argv[2]);
	else if (!strcmp(argv[0], "E") && argc == 7)
		cmd_emulate(bytes, n, argv + 2);
	else if (!strcmp(argv[0], "C") && argc == 3)
		cmd_compat(bytes, n, argv[2]);
	else if (!strcmp(argv[0], "N") && argc == 2)
		cmd_compat_need(bytes, n);
	else if (!strcmp(argv[0], "K") && argc == 3)
		cmd_kernel(bytes, n, argv[2]);
	else if (!strcmp(argv[0], "X") && argc == 4)
		cmd_cpu(bytes, n, argv[2], argv[3]);
	else
		printf("BADCMD");
}

/* Run one command; a stray fault answers "SEGV" instead of killing us. */
static void run_guarded(int argc, char **argv)
{
	segv_armed = 1;
	if (sigsetjmp(segv_env, 1)) {
		printf("SEGV");
		return;
	}
	dispatch(argc, argv);
	segv_armed = 0;
}

int main(void)
{
	struct sigaction sa;
	char *line = NULL;
	size_t cap = 0;
	u8 *map;

	page_size = sysconf(_SC_PAGESIZE);
	map = mmap(NULL, 2 * page_size, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED || mprotect(map + page_size, page_size, PROT_NONE)) {
		perror("mmap");
		return 1;
	}
	guard_page = map;
	cpu_page = mmap((void *)CPU_ADDR, CPU_PAGE, PROT_READ | PROT_WRITE | PROT_EXEC,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (cpu_page == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_segv;
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);

	while (getline(&line, &cap, stdin) > 0) {
		char *argv[8] = { NULL };
		char *save = NULL, *tok;
		int argc = 0;

		for (tok = strtok_r(line, " \t\n", &save); tok && argc < 8;
		     tok = strtok_r(NULL, " \t\n", &save))
			argv[argc++] = tok;
		if (argc == 0)
			continue;
		run_guarded(argc, argv);
		printf("\n");
	}
	free(line);
	fflush(stdout);
	return 0;
}
