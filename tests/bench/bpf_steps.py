#!/usr/bin/env python3
"""Where the BPF record's time goes: the helper alone (emulate mode, no
tracer) with BPF programs of growing cost attached to its access
tracepoint in turn, two rounds: ns per access of rloop, and each program's
own run time (BPF statistics on).  The steps: an empty program, the
64-byte probe read of the helper's record, a ring buffer reserve and
commit of it, the clock (bpf_ktime_get_ns), three per-CPU lookups, the CPU
and the pid.  In the test VM (bcc compiles each step):

    tests/vm/run --qemu '-device edu' -- .venv/bin/python tests/bench/bpf_steps.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))
sys.path.insert(0, str(REPO))
import guest_bench as gb  # noqa: E402
from bcc import BPF  # noqa: E402

from mmiotrace_ng.common import bpfsys  # noqa: E402

COUNT = 50_000
HDR = r"""
#include <linux/types.h>
struct acc { u64 a[8]; };
BPF_RINGBUF_OUTPUT(events, 8192);   /* 32 MiB: every run's records fit, no reader */
BPF_PERCPU_ARRAY(pc1, u64, 2);
BPF_PERCPU_ARRAY(pc2, u64, 1);
BPF_PERCPU_ARRAY(pc3, u64, 4);
"""
READ = ("struct acc a; int z = 0; "
        "if (bpf_probe_read_kernel(&a, sizeof(a), (void *)ctx->args[0])) return 0; ")
RESERVE = ("struct acc *r = events.ringbuf_reserve(sizeof(*r)); if (!r) return 0; "
           "__builtin_memcpy(r, &a, sizeof(a)); ")
SUBMIT = "events.ringbuf_submit(r, BPF_RB_NO_WAKEUP); return 0;"
STEPS = {
    "empty": "return 0;",
    "probe read": READ + "return a.a[1] == 7;",
    "+ reserve, commit": READ + RESERVE + SUBMIT,
    "+ clock": READ + RESERVE + "r->a[0] = bpf_ktime_get_ns(); " + SUBMIT,
    "+ per-CPU lookups, cpu, pid":
        READ + "u64 *p1 = pc1.lookup(&z); u64 *p2 = pc2.lookup(&z); u64 *p3 = pc3.lookup(&z); "
        + RESERVE + "r->a[0] = bpf_ktime_get_ns(); r->a[1] = bpf_get_smp_processor_id(); "
        "r->a[2] = bpf_get_current_pid_tgid(); if (p1) r->a[3] = *p1; if (p2) r->a[4] = *p2; "
        "if (p3) r->a[5] = *p3; " + SUBMIT,
}


def main() -> int:
    subprocess.run(["rmmod", "mmiotng"], capture_output=True, check=False)
    subprocess.run(["insmod", str(REPO / "kmod" / "mmiotng.ko"), "test_modes=1"], check=True)
    gb.load_exerciser()
    bdf = gb.find_edu()
    stats = bpfsys.enable_stats()
    res: dict[str, list[tuple[float, float]]] = {}
    try:
        with gb.HelperOnly(bdf, "EMULATE"):
            gb.warm_up(None, {"rloop": COUNT})
            base = statistics.median(gb.run_scenario("rloop", COUNT) for _ in range(5))
            print(f"no program: {base / COUNT:.0f} ns/access", flush=True)
            for rnd in range(2):
                for name, body in STEPS.items():
                    # RAW_TRACEPOINT_PROBE: bcc attaches it as it loads it
                    b = BPF(text=HDR + "RAW_TRACEPOINT_PROBE(mmiotng_access) { " + body + " }")
                    fd = next(iter(b.funcs.values())).fd
                    gb.run_scenario("rloop", COUNT)
                    i0 = bpfsys.prog_info(fd)
                    ns = statistics.median(gb.run_scenario("rloop", COUNT) for _ in range(5))
                    i1 = bpfsys.prog_info(fd)
                    per = (i1["run_time_ns"] - i0["run_time_ns"]) / max(
                        i1["run_cnt"] - i0["run_cnt"], 1)
                    res.setdefault(name, []).append((ns / COUNT, per))
                    print(f"round {rnd}: {name}: {ns / COUNT:.0f} ns/access, {per:.0f} ns a "
                          "run in the program", flush=True)
                    b.cleanup()
    finally:
        os.close(stats)
    print("| step | ns/access | ns in the program |\n|---|---:|---:|")
    for name, v in res.items():
        print(f"| {name} | {statistics.median(x for x, _ in v):.0f} | "
              f"{statistics.median(y for _, y in v):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
