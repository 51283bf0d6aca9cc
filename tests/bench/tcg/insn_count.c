// SPDX-License-Identifier: GPL-2.0
/*
 * A QEMU TCG plugin (plugin API version 1: QEMU 7.x, Debian 12's) for
 * tests/bench/insn_profile.py: guest instructions executed, per
 * translation block and per vCPU, in phases.  The guest names the phase
 * it is in by writing one line to the file phase=PATH; when the name
 * changes, the counts since the last change are appended to
 * out=DIR/NAME.tb ("vaddr instructions vcpu executions" lines: a phase
 * entered again adds lines) and zeroed.  Only what a guest executes is counted, not what it costs QEMU,
 * but under TCG the two go together.
 *
 * Its own declarations of the few plugin API functions it uses (QEMU's
 * qemu-plugin.h is not packaged); they match QEMU 7.2's.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS };
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id,
	void (*cb)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb));
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb,
	void (*cb)(unsigned int vcpu_index, void *udata),
	enum qemu_plugin_cb_flags flags, void *udata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

#define SLOTS	(1u << 20)	/* translation blocks counted, at most */
#define VCPUS	8

struct block {
	uint64_t vaddr;
	uint64_t insns;
	uint64_t execs[VCPUS];
};

static struct block *blocks;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const char *phase_file = "/tmp/phase", *out_dir = "/tmp";

/* The block of (vaddr, insns): a block translated again shares it. */
static struct block *block_of(uint64_t vaddr, uint64_t insns)
{
	uint64_t h = (vaddr * 0x9E3779B97F4A7C15ull ^ insns) >> 44;
	unsigned int tries;

	for (tries = 0; tries < SLOTS; tries++, h++) {
		struct block *b = &blocks[h & (SLOTS - 1)];

		if (b->vaddr == vaddr && b->insns == insns)
			return b;
		if (!b->vaddr) {
			b->insns = insns;
			b->vaddr = vaddr;
			return b;
		}
	}
	return NULL;
}

static void executed(unsigned int vcpu, void *udata)
{
	struct block *b = udata;

	if (vcpu < VCPUS)
		__atomic_fetch_add(&b->execs[vcpu], 1, __ATOMIC_RELAXED);
}

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
	struct block *b;

	(void)id;
	pthread_mutex_lock(&lock);
	b = block_of(qemu_plugin_tb_vaddr(tb), qemu_plugin_tb_n_insns(tb));
	pthread_mutex_unlock(&lock);
	if (b)
		qemu_plugin_register_vcpu_tb_exec_cb(tb, executed, QEMU_PLUGIN_CB_NO_REGS, b);
}

/* The counts since the last phase change, into DIR/NAME.tb (or dropped). */
static void flush(const char *name)
{
	char path[4096];
	FILE *f = NULL;
	unsigned int i, v;

	if (name[0]) {
		snprintf(path, sizeof(path), "%s/%s.tb", out_dir, name);
		f = fopen(path, "a");
	}
	for (i = 0; i < SLOTS; i++) {
		struct block *b = &blocks[i];

		for (v = 0; v < VCPUS; v++) {
			uint64_t n = __atomic_exchange_n(&b->execs[v], 0, __ATOMIC_RELAXED);

			if (n && f)
				fprintf(f, "%llx %llu %u %llu\n", (unsigned long long)b->vaddr,
					(unsigned long long)b->insns, v, (unsigned long long)n);
		}
	}
	if (f)
		fclose(f);
}

static void *watch(void *arg)
{
	char cur[256] = "", buf[256];

	(void)arg;
	for (;;) {
		FILE *f = fopen(phase_file, "r");

		buf[0] = 0;
		if (f) {
			if (!fgets(buf, sizeof(buf), f))
				buf[0] = 0;
			fclose(f);
		}
		buf[strcspn(buf, "\n")] = 0;
		if (buf[0] && strcmp(buf, cur)) {
			flush(cur);
			snprintf(cur, sizeof(cur), "%s", buf);
		}
		usleep(20000);
	}
	return NULL;
}

__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
	pthread_t t;
	int i;

	(void)info;
	for (i = 0; i < argc; i++) {
		if (!strncmp(argv[i], "phase=", 6))
			phase_file = argv[i] + 6;
		else if (!strncmp(argv[i], "out=", 4))
			out_dir = argv[i] + 4;
	}
	blocks = calloc(SLOTS, sizeof(*blocks));
	if (!blocks || pthread_create(&t, NULL, watch, NULL))
		return -1;
	qemu_plugin_register_vcpu_tb_trans_cb(id, translated);
	return 0;
}
