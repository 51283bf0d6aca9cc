#!/usr/bin/env python3
"""Guest instructions per MMIO access, by part of the path: a count, not a
timing, so two builds compare without the noise of timings under TCG.

One guest boot (tests/vm/run, Debian's 6.1 by default, the edu device)
with QEMU's TCG plugin tests/bench/tcg/insn_count.c, built here with the
host's gcc.  In the guest the exerciser's rloop and wloop run on CPU 0 in
four set-ups, each a phase of its own: untraced, the helper alone in its
trap-only floor mode and in its emulate mode (no BPF program), and the
whole tracer (mmiotrace-ng, its process on CPU 1).  The plugin counts the
instructions each vCPU executed in each phase, per translation block;
this script gives each block its function (the guest's /proc/kallsyms,
with net.core.bpf_jit_kallsyms=1 for the BPF programs) and prints, for
CPU 0, the instructions and translation blocks per access of each set-up,
and the functions that make the difference between one and the next:

    trap            floor - untraced     the fault taken and the instruction skipped
    decode+emulate  emulate - floor      the helper's decode, access and record
    BPF record      full - emulate       the tracepoint, the BPF program, the ring

    tests/bench/insn_profile.py                # ~4 min under TCG
    tests/bench/insn_profile.py --json FILE    # also the numbers as JSON
    tests/bench/insn_profile.py --append 'clocksource=tsc tsc=reliable'

Under TCG the time of a path goes with its instructions (the trap-only
floor: ~1.1 us for ~600 instructions, of which the exception's entry and
exit are most): `tests/bench/run` times them, this script says where they
go.  Progress on stderr, the tables on stdout.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN_SRC = REPO / "tests" / "bench" / "tcg" / "insn_count.c"
SCENARIOS = {"rloop": 50_000, "wloop": 50_000}
RUNS = 5
SETUPS = ("untraced", "floor", "emulate", "full")
PARTS = (("trap", "untraced", "floor"), ("decode+emulate", "floor", "emulate"),
         ("BPF record", "emulate", "full"))
TOP = 12


def log(msg: str) -> None:
    print(f"insn_profile: {msg}", file=sys.stderr, flush=True)


# -- in the guest ----------------------------------------------------------

def guest(out: Path) -> int:
    sys.path.insert(0, str(REPO / "tests" / "bench"))
    import guest_bench as gb

    phase_file = out / "phase"

    def phase(name: str) -> None:
        phase_file.write_text(name + "\n")
        time.sleep(0.2)     # the plugin looks every 20 ms

    Path("/proc/sys/net/core/bpf_jit_kallsyms").write_text("1\n")
    os.sched_setaffinity(0, {0})    # the loops run in this task: on CPU 0
    gb.load_exerciser()
    bdf = gb.find_edu()
    gb.load_helper()
    accesses: dict[str, int] = {}

    def measure(setup: str, scenario, after=lambda: None) -> None:
        """RUNS runs of each scenario, each counted from the write that
        starts it to its return (after: what follows a run, not counted)."""
        for name, count in SCENARIOS.items():
            scenario(name, count)       # translated and warm, not counted
            after()
            for _ in range(RUNS):
                phase(f"{setup}-{name}")
                scenario(name, count)
                phase("idle")
                after()
            accesses[f"{setup}-{name}"] = RUNS * gb.accesses(name, count)
            log(f"{setup} {name}: done")

    phase("idle")
    measure("untraced", gb.run_scenario)
    for setup, mode in (("floor", "TRAP_ONLY"), ("emulate", "EMULATE")):
        with gb.HelperOnly(bdf, mode):
            measure(setup, gb.run_scenario)
    tracer = gb.NgTracer(bdf, [], "insn_profile")
    tracer.argv = ["taskset", "-c", "1", *tracer.argv]      # the reader on CPU 1
    tracer.start()
    try:
        # its BPF programs by name (bpf_jit_kallsyms) while they are loaded
        syms = Path("/proc/kallsyms").read_text()
        (out / "kallsyms").write_text(syms)
        log(f"{syms.count('[bpf]')} BPF symbols")
        marks = iter(range(1, 1 << 30))

        def drained() -> None:
            """The stream read up to a marker written after the run."""
            tracer.seq = next(marks)
            tracer._wait_end(tracer.seq)
            tracer.pump()

        measure("full", tracer.scenario, drained)
    finally:
        tracer.stop()
    phase("end")
    (out / "accesses.json").write_text(json.dumps(accesses))
    problems = gb.kernel_log_problems()
    if problems:
        log("kernel log problems:\n" + "\n".join(problems))
        return 1
    return 0


# -- on the host -----------------------------------------------------------

class Symbols:
    """The guest's kallsyms: the function of an address."""

    def __init__(self, path: Path) -> None:
        syms = []
        for line in path.read_text().splitlines():
            addr, _kind, name, *mod = line.split()
            syms.append((int(addr, 16), name + (f" {mod[0]}" if mod else "")))
        syms.sort()
        self.addrs = [a for a, _ in syms]
        self.names = [n for _, n in syms]
        self.end = max((a for a, n in syms if n == "_end"), default=1 << 64)

    def __call__(self, addr: int) -> str:
        if addr < 0xffff800000000000:
            return "(user space)"
        i = bisect.bisect_right(self.addrs, addr) - 1
        if i < 0:
            return "?"
        if addr >= self.end and " [" not in self.names[i]:
            # past the kernel image, in no module: the BPF JIT's code
            # (kallsyms lists no program of the tracer's loader)
            return "(BPF programs, JIT)"
        return self.names[i]


def load_phase(path: Path, sym: Symbols, vcpu: int) -> tuple[Counter, Counter]:
    """Instructions and blocks executed on vcpu, per function."""
    insns: Counter = Counter()
    blocks: Counter = Counter()
    for line in path.read_text().splitlines():
        vaddr, n, cpu, execs = line.split()
        if int(cpu) != vcpu:
            continue
        name = sym(int(vaddr, 16))
        insns[name] += int(n) * int(execs)
        blocks[name] += int(execs)
    return insns, blocks


def build_plugin(dest: Path) -> Path:
    so = dest / "insn_count.so"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    "-fvisibility=hidden", "-o", str(so), str(PLUGIN_SRC), "-lpthread"],
                   check=True)
    return so


def report(out: Path) -> dict:
    sym = Symbols(out / "kallsyms")
    accesses = json.loads((out / "accesses.json").read_text())
    res: dict = {"setups": {}, "parts": {}}
    for name in SCENARIOS:
        per: dict[str, tuple[Counter, Counter]] = {}
        for setup in SETUPS:
            ins, blk = load_phase(out / f"{setup}-{name}.tb", sym, 0)
            n = accesses[f"{setup}-{name}"]
            per[setup] = (Counter({k: v / n for k, v in ins.items()}),
                          Counter({k: v / n for k, v in blk.items()}))
        res["setups"][name] = {s: {"insns": round(sum(per[s][0].values()), 1),
                                   "blocks": round(sum(per[s][1].values()), 1)}
                               for s in SETUPS}
        res["parts"][name] = {}
        for part, a, b in PARTS:
            delta = Counter(per[b][0])
            delta.subtract(per[a][0])
            top = sorted(delta.items(), key=lambda kv: -abs(kv[1]))[:TOP]
            res["parts"][name][part] = {
                "insns": round(sum(delta.values()), 1),
                "functions": [[f, round(v, 1)] for f, v in top],
            }
    return res


def print_tables(res: dict) -> None:
    print("#### Guest instructions per access on the loop's CPU "
          "(translation blocks per access)\n")
    print("| scenario | " + " | ".join(SETUPS) + " | full / floor |")
    print("|---|" + "---:|" * (len(SETUPS) + 1))
    for name, s in res["setups"].items():
        cells = [f"{s[x]['insns']:,.0f} ({s[x]['blocks']:,.0f})" for x in SETUPS]
        print(f"| {name} | " + " | ".join(cells)
              + f" | {s['full']['insns'] / s['floor']['insns']:.2f}x |")
    for name, parts in res["parts"].items():
        for part, p in parts.items():
            print(f"\n#### {name}: {part}, {p['insns']:,.0f} instructions per access; "
                  "the functions that differ most\n")
            print("| function | instructions per access |")
            print("|---|---:|")
            for f, v in p["functions"]:
                print(f"| `{f}` | {v:+,.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the numbers here")
    ap.add_argument("--kernel", help="installed kernel version to boot (default: tests/vm/run's)")
    ap.add_argument("--append", metavar="ARGS",
                    help="extra kernel arguments, e.g. 'clocksource=tsc tsc=reliable' (the "
                         "guest's clock is hpet under TCG, an emulated device read per stamp; "
                         "real machines and KVM guests read the TSC)")
    ap.add_argument("--timeout", type=int, default=1500)
    ap.add_argument("--guest", type=Path, metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.guest:
        return guest(args.guest)
    with tempfile.TemporaryDirectory(dir=REPO / "tests" / "bench", prefix=".insn-") as tmp:
        out = Path(tmp)
        so = build_plugin(out)
        cmd = [str(REPO / "tests" / "vm" / "run"), "--qemu", "-device edu",
               "--qemu", f"-plugin {so},phase={out / 'phase'},out={out}",
               "--timeout", str(args.timeout)]
        if args.kernel:
            cmd += ["--kernel", args.kernel]
        if args.append:
            cmd += ["--append", args.append]
        cmd += ["--", str(REPO / ".venv" / "bin" / "python"), str(Path(__file__).resolve()),
                "--guest", str(out)]
        log("booting the guest with the plugin (the helper and exerciser as built)")
        rc = subprocess.run(cmd).returncode
        if rc:
            log(f"the guest part failed (exit {rc})")
            return rc
        res = report(out)
    print_tables(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
