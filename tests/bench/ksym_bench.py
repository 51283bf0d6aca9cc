"""The cost of a watched access, side by side in one boot (run in the test
guest by tests/bench/ksym): the exerciser writes its variable COUNT times
(stress scenario watch_write) and reads an MMIO register COUNT times (run
scenario rloop), timed with nothing watching, under Debian's perf
(`perf stat` and `perf record` with a mem: breakpoint event), under
`mmiotrace-ng ksym` (a line per hit, and --histogram), and under MMIO
tracing (the trace, and --histogram).  Prints JSON on stdout: ns per access
of each, median of REPEAT runs, and the ratios."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NG = [str(REPO / "tests" / "vm" / "bin" / "mmiotrace-ng")]
EXERCISER_KO = REPO / "tests" / "drivers" / "edu_exerciser" / "edu_exerciser.ko"
DEBUGFS = Path("/sys/kernel/debug/edu_exerciser")
REPEAT = 3
PERF_SETTLE_S = 20.0    # perf record's start-up (kallsyms, task synthesis) under TCG


def log(msg: str) -> None:
    print(f"ksym-bench: {msg}", file=sys.stderr, flush=True)


def timed(path: Path, cmd: str) -> float:
    t0 = time.perf_counter()
    path.write_text(cmd + "\n")
    return time.perf_counter() - t0


def address(name: str) -> int:
    for line in Path("/proc/kallsyms").read_text().splitlines():
        parts = line.split()
        if parts[2] == name and parts[3:] == ["[edu_exerciser]"]:
            return int(parts[0], 16)
    raise SystemExit(f"{name} not in kallsyms")


class Background:
    """A tracer running while the workload is timed; `ready` on stderr for
    mmiotrace-ng, a short settle for perf."""

    def __init__(self, cmd: list[str], ready: str | None) -> None:
        self.err = open("/tmp/ksym-bench.err", "w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.monotonic() + 600
        while True:
            if ready is None:
                time.sleep(PERF_SETTLE_S)   # perf says nothing when its events are on
                break
            if ready in Path("/tmp/ksym-bench.err").read_text():
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{cmd} did not start: "
                                 + Path("/tmp/ksym-bench.err").read_text())
            time.sleep(0.2)

    def stop(self) -> str:
        """Its stderr, once it has ended."""
        self.proc.send_signal(2)
        if self.proc.wait(600) not in (0, 130, -2):
            raise SystemExit(f"tracer exited {self.proc.returncode}: "
                             + Path("/tmp/ksym-bench.err").read_text())
        return Path("/tmp/ksym-bench.err").read_text()


# what each tool says it saw: a measurement counts only if it saw every hit
SEEN = {
    "perf stat": re.compile(r"^\s*([\d,.]+)\s+mem:", re.M),
    "perf record": re.compile(r"\((\d+) samples\)"),
    "ksym": re.compile(r"hits printed \(\S+ (\d+) counted\), lost 0"),
    "ksym --histogram": re.compile(r"mmiotrace-ng: (\d+) hits"),
}


def measure(cmd: list[str] | None, ready: str | None, path: Path, work: str,
            count: int, label: str) -> float:
    """ns per access of `work` (COUNT accesses), median of REPEAT runs; the
    tool must have seen all (REPEAT + 1) * COUNT hits."""
    bg = Background(cmd, ready) if cmd else None
    err = ""
    try:
        timed(path, work)                       # warm up
        runs = [timed(path, work) for _ in range(REPEAT)]
    finally:
        if bg:
            err = bg.stop()
    if label in SEEN:
        m = SEEN[label].search(err)
        seen = int(m[1].replace(",", "").replace(".", "")) if m else -1
        if seen != (REPEAT + 1) * count:
            raise SystemExit(f"{label} saw {seen} hits, not {(REPEAT + 1) * count}:\n{err}")
    return statistics.median(runs) / count * 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=20000)
    args = ap.parse_args()
    n = args.count
    if not DEBUGFS.exists():
        subprocess.run(["insmod", str(EXERCISER_KO)], check=True)
    dev = subprocess.run(["lspci", "-D", "-d", "1234:11e8"], capture_output=True, text=True,
                         check=True).stdout.split()[0]
    var = f"mem:0x{address('edu_watched'):x}/4:w"
    stress, run = DEBUGFS / "stress", DEBUGFS / "run"
    write, rloop = f"watch_write {n}", f"rloop {n}"
    ns: dict[str, float] = {}
    for label, cmd, ready in [
        ("untraced", None, None),
        ("perf stat", ["perf", "stat", "-a", "-e", var], None),
        ("perf record", ["perf", "record", "-a", "-c", "1", "-e", var, "-o", "/tmp/perf.data"],
         None),
        ("ksym", [*NG, "ksym", "edu_exerciser:edu_watched:-w-", "--buffer-size-kb", "16384",
                  "-o", "/tmp/ksym.txt"],
         "mmiotrace-ng: ready"),
        ("ksym --histogram", [*NG, "ksym", "edu_exerciser:edu_watched:-w-", "--histogram",
                              "-o", "/tmp/ksym-hist.txt"], "mmiotrace-ng: ready"),
    ]:
        log(f"watch_write x{n}: {label}")
        ns[f"write {label}"] = measure(cmd, ready, stress, write, n, label)
    for label, extra in [("untraced", None), ("trace", []), ("--histogram", ["--histogram"])]:
        log(f"rloop x{n}: MMIO {label}")
        cmd = None if extra is None else [*NG, "--pci", dev, *extra, "-o", "/tmp/mmio.txt"]
        ns[f"mmio {label}"] = measure(cmd, "mmiotrace-ng: ready" if cmd else None, run, rloop, n,
                                      f"mmio {label}")
    hit = {k: v - ns["write untraced"] for k, v in ns.items() if k.startswith("write ")}
    acc = {k: v - ns["mmio untraced"] for k, v in ns.items() if k.startswith("mmio ")}
    out = {
        "count": n, "repeat": REPEAT, "ns_per_access": ns,
        "ns_per_hit_over_untraced": hit,
        "ratio_ksym_to_perf_record": hit["write ksym"] / hit["write perf record"],
        "ratio_ksym_histogram_to_perf_record": (hit["write ksym --histogram"]
                                                / hit["write perf record"]),
        "ratio_ksym_histogram_to_perf_stat": (hit["write ksym --histogram"]
                                              / hit["write perf stat"]),
        "ratio_mmio_histogram_to_trace": acc["mmio --histogram"] / acc["mmio trace"],
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
