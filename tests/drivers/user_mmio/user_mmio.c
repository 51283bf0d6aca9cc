// SPDX-License-Identifier: GPL-2.0
/*
 * The truth for the tests of user-space tracing: maps a PCI device's BAR
 * through its sysfs resource file and makes a known sequence of accesses,
 * printing each as it made it (pid, R or W, width, offset, the value read
 * or written, the address of the instruction):
 *
 *   ACCESS pid op width offset value pc
 *
 * Usage: user_mmio RESOURCE_FILE [alu] [fork] [syscall] [remap] [mremap] [count N] [loop SECONDS] [hold]
 *   alu: then ALU instructions on offset 0x80 (or, cmp, test, add into
 *        a register, and from one, inc, an 8-byte or), each printed as
 *        the accesses it makes (the values it reads known from what was
 *        written before), and "ALU name register flags" (the register
 *        operand and the arithmetic flags after it); a read of 0x80 (it
 *        must read what the last one wrote); last a lock or (which the
 *        tracer does not emulate: it gives the page up) and "LOCKED
 *        value", what a read of 0x80 then gives;
 *   syscall: then the kernel reads the mapping (a write() of its first 4
 *            bytes into a pipe) and it prints "PIPE value";
 *   remap: then it unmaps the BAR, maps it again, prints "REMAPPED pid
 *          address" and reads offset 0 there;
 *   mremap: then it moves the mapping elsewhere (mremap with
 *           MREMAP_FIXED), prints "MOVED pid address" and reads offset 0
 *           there;
 *   count N: then it makes N reads of offset 0 and prints "COUNT N ns",
 *            the nanoseconds they took (CLOCK_MONOTONIC; the benchmark's);
 *   loop: then it reads offset 0 for that long (0: until a SIGUSR1) and
 *         prints "LOOP reads wrong", the reads made and those that did
 *         not read the identification;
 *   hold: then it waits for a line on stdin, makes 64 reads of offset 0
 *         and prints "FAULTS n", the page faults the kernel handled for
 *         them (getrusage's minor and major faults: an entry left armed is
 *         made present by the kernel at its first access, one fault; a
 *         fault the tracer's helper emulates is not counted there).  Not
 *         a perf counter: enabling one patches the kernel's fault path,
 *         which multi-threaded TCG can run stale on another vCPU.
 * With "rdonly" as the first option it maps the BAR read-only instead,
 * reads offset 0 (printed), prints "OR" and makes an or on offset 0: a
 * SIGSEGV, traced or not.
 * It prints "MAPPED pid address" first.  The offsets are QEMU edu's:
 * 0x00 (identification), 0x04 (liveness: reads back the complement of
 * what was written), 0x80 (an 8-byte register).
 */
#define _GNU_SOURCE	/* RUSAGE_THREAD */
#include <fcntl.h>
#include <signal.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile uint8_t *bar;
static volatile sig_atomic_t stop_loop;

static void on_usr1(int sig)
{
	stop_loop = 1;
}

static void said(char op, int width, unsigned int off, uint64_t val, uint64_t pc)
{
	printf("ACCESS %d %c %d 0x%x 0x%" PRIx64 " 0x%" PRIx64 "\n",
	       getpid(), op, width, off, val, pc);
	fflush(stdout);
}

#define READ(insn, type, width, off)						\
	do {									\
		uint64_t pc;							\
		type v;								\
		asm volatile("lea 1f(%%rip), %1\n1: " insn " (%2), %0"		\
			     : "=r" (v), "=&r" (pc)				\
			     : "r" (bar + (off)) : "memory");			\
		said('R', width, off, (uint64_t)v, pc);				\
	} while (0)

#define WRITE(insn, type, width, off, val)					\
	do {									\
		uint64_t pc;							\
		type v = (val);							\
		asm volatile("lea 1f(%%rip), %0\n1: " insn " %1, (%2)"		\
			     : "=&r" (pc) : "r" (v), "r" (bar + (off)) : "memory");	\
		said('W', width, off, (uint64_t)v, pc);				\
	} while (0)

/*
 * One ALU instruction on the BAR at off (%3 in insn), with a register
 * operand (%2, in and out): its accesses as the program expects them (it
 * reads rd; it writes wr if it writes), then what it left in the register
 * and the arithmetic flags.
 */
#define ALU(name, insn, width, off, regval, rd, writes, wr)			\
	do {									\
		uint64_t pc, fl, r = (regval);					\
		asm volatile("lea 1f(%%rip), %0\n1: " insn "\n\tpushfq\n\tpop %1"	\
			     : "=&r" (pc), "=&r" (fl), "+r" (r)			\
			     : "r" (bar + (off)) : "memory", "cc");		\
		said('R', width, off, (rd), pc);				\
		if (writes)							\
			said('W', width, off, (wr), pc);			\
		printf("ALU %s 0x%" PRIx64 " 0x%" PRIx64 "\n", name, r, fl & 0x8d5);	\
		fflush(stdout);							\
	} while (0)

static void alu(void)
{
	uint32_t cur = 0x12345670;

	WRITE("movl", uint32_t, 4, 0x80, cur);
	ALU("or", "orl $0x0f, (%3)", 4, 0x80, 0, cur, 1, cur | 0x0f);
	cur |= 0x0f;
	ALU("cmp", "cmpl $0x1234567f, (%3)", 4, 0x80, 0, cur, 0, 0);
	ALU("test", "testl $0x80, (%3)", 4, 0x80, 0, cur, 0, 0);
	ALU("add-to-reg", "addl (%3), %k2", 4, 0x80, 1, cur, 0, 0);
	ALU("and", "andl %k2, (%3)", 4, 0x80, 0xffff00ffu, cur, 1, cur & 0xffff00ffu);
	cur &= 0xffff00ffu;
	ALU("inc", "incl (%3)", 4, 0x80, 0, cur, 1, cur + 1);
	cur += 1;
	WRITE("movq", uint64_t, 8, 0x80, 0x1122334455667000ULL);
	ALU("or-8", "orq $1, (%3)", 8, 0x80, 0, 0x1122334455667000ULL, 1, 0x1122334455667001ULL);
	WRITE("movl", uint32_t, 4, 0x80, cur);
	READ("movl", uint32_t, 4, 0x80);
	asm volatile("lock orl $0x100, (%0)" : : "r" (bar + 0x80) : "memory", "cc");
	printf("LOCKED 0x%x\n", *(volatile uint32_t *)(bar + 0x80));
	fflush(stdout);
}

/* rep movsb of n bytes from the BAR at off into buf: n one-byte reads */
static void copy_in(unsigned int off, uint8_t *buf, unsigned long n)
{
	const volatile uint8_t *src = bar + off;
	uint8_t *dst = buf;
	unsigned long left = n, i;
	uint64_t pc;

	memset(buf, 0, n);	/* the user side is there: no fault on it */
	asm volatile("lea 1f(%%rip), %0\n1: rep movsb"
		     : "=&r" (pc), "+S" (src), "+D" (dst), "+c" (left) : : "memory");
	for (i = 0; i < n; i++)
		said('R', 1, off + i, buf[i], pc);
}

/* a 4-byte read of the BAR at offset 0 with a plain mov (whatever the compiler would make) */
static uint32_t ident(void)
{
	uint32_t v;

	asm volatile("movl (%1), %0" : "=r" (v) : "r" (bar) : "memory");
	return v;
}

static long faults(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_THREAD, &ru))
		return -1;
	return ru.ru_minflt + ru.ru_majflt;
}

int main(int argc, char **argv)
{
	int fd, i, child = 0, hold = 0, sys = 0, remap = 0, loop = -1, alus = 0, move = 0;
	long count = -1;
	uint8_t buf[4];

	if (argc < 2) {
		fprintf(stderr, "usage: user_mmio RESOURCE_FILE [alu] [fork] [syscall] [remap] [loop S] [hold]\n");
		return 2;
	}
	for (i = 2; i < argc; i++) {
		alus |= !strcmp(argv[i], "alu");
		child |= !strcmp(argv[i], "fork");
		hold |= !strcmp(argv[i], "hold");
		sys |= !strcmp(argv[i], "syscall");
		remap |= !strcmp(argv[i], "remap");
		move |= !strcmp(argv[i], "mremap");
		if (!strcmp(argv[i], "count") && i + 1 < argc)
			count = atol(argv[++i]);
		if (!strcmp(argv[i], "loop") && i + 1 < argc)
			loop = atoi(argv[++i]);
	}
	if (argc > 2 && !strcmp(argv[2], "rdonly")) {
		fd = open(argv[1], O_RDONLY | O_SYNC);
		bar = fd < 0 ? MAP_FAILED : mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
		if (bar == MAP_FAILED) {
			perror(argv[1]);
			return 1;
		}
		printf("MAPPED %d 0x%lx\n", getpid(), (unsigned long)bar);
		READ("movl", uint32_t, 4, 0x00);
		printf("OR\n");
		fflush(stdout);
		asm volatile("orl $1, (%0)" : : "r" (bar) : "memory", "cc");
		return 0;
	}
	fd = open(argv[1], O_RDWR | O_SYNC);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	bar = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (bar == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	printf("MAPPED %d 0x%lx\n", getpid(), (unsigned long)bar);
	fflush(stdout);
	READ("movl", uint32_t, 4, 0x00);
	WRITE("movl", uint32_t, 4, 0x04, 0x12345678);
	READ("movl", uint32_t, 4, 0x04);
	WRITE("movq", uint64_t, 8, 0x80, 0x1122334455667000ULL);
	READ("movq", uint64_t, 8, 0x80);
	READ("movb", uint8_t, 1, 0x00);
	READ("movw", uint16_t, 2, 0x00);
	copy_in(0x08, buf, sizeof(buf));
	if (alus)
		alu();
	if (child) {
		pid_t pid = fork();

		if (pid < 0) {
			perror("fork");
			return 1;
		}
		if (!pid) {
			READ("movl", uint32_t, 4, 0x00);
			_exit(0);
		}
		if (waitpid(pid, &i, 0) != pid || !WIFEXITED(i) || WEXITSTATUS(i)) {
			fprintf(stderr, "the child failed\n");
			return 1;
		}
	}
	if (sys) {
		uint32_t got = 0;
		int p[2];

		if (pipe(p) || write(p[1], (const void *)bar, 4) != 4 ||
		    read(p[0], &got, 4) != 4) {
			perror("pipe");
			return 1;
		}
		printf("PIPE 0x%x\n", got);
		fflush(stdout);
	}
	if (remap) {
		if (munmap((void *)bar, 4096)) {
			perror("munmap");
			return 1;
		}
		bar = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (bar == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
		printf("REMAPPED %d 0x%lx\n", getpid(), (unsigned long)bar);
		fflush(stdout);
		READ("movl", uint32_t, 4, 0x00);
	}
	if (move) {
		/* a place of its own, taken by the move */
		void *to = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (to == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
		to = mremap((void *)bar, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, to);
		if (to == MAP_FAILED) {
			perror("mremap");
			return 1;
		}
		bar = to;
		printf("MOVED %d 0x%lx\n", getpid(), (unsigned long)bar);
		fflush(stdout);
		READ("movl", uint32_t, 4, 0x00);
	}
	close(fd);
	if (count >= 0) {
		struct timespec t0, t1;
		uint64_t wrong = 0;
		long n;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (n = 0; n < count; n++)
			wrong += ident() != 0x010000ed;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (wrong) {
			fprintf(stderr, "%" PRIu64 " reads were wrong\n", wrong);
			return 1;
		}
		printf("COUNT %ld %lld\n", count, (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL +
		       (t1.tv_nsec - t0.tv_nsec));
		fflush(stdout);
	}
	if (loop >= 0) {
		time_t end = time(NULL) + loop;
		uint64_t reads = 0, wrong = 0;

		signal(SIGUSR1, on_usr1);
		printf("LOOPING\n");
		fflush(stdout);
		while (loop ? time(NULL) < end : !stop_loop) {
			for (i = 0; i < 256; i++, reads++)
				wrong += ident() != 0x010000ed;
		}
		printf("LOOP %" PRIu64 " %" PRIu64 "\n", reads, wrong);
		fflush(stdout);
	}
	if (hold) {
		uint64_t sum = 0;
		char line[16];
		long n;

		printf("HOLDING\n");
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			return 1;
		n = faults();
		for (i = 0; i < 64; i++)
			sum += ident();
		n = faults() - n;
		printf("FAULTS %ld %s\n", n, sum == 64ULL * 0x010000ed ? "ident" : "wrong");
		fflush(stdout);
	}
	return 0;
}
