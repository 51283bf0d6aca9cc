"""The throughput of `mmiotrace-ng diff` on two equal traces (host only).

    .venv/bin/python tests/bench/diff_bench.py [RECORDS]    # default 1_000_000

builds, in a temporary directory, two text traces and two recorded files of
the same driver run as two boots would give it: the same accesses, but other
timestamps, map ids, virtual addresses, instruction addresses and pids, and
polling loops that spin a different number of times; then times
`diff.diff()` on each pair (CPU time of this process, best of 3) and prints
records per second: the records of one trace over the time the whole
comparison of the pair took.  The unit tests use `synthetic_lines` and
`write_recording` as large inputs whose comparison is known to be "equal".
"""

from __future__ import annotations

import argparse
import ctypes
import io
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmiotrace_ng.analysis import diff
from mmiotrace_ng.format import rawfile  # noqa: E402
from mmiotrace_ng.format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_WRITE  # noqa: E402
from mmiotrace_ng.format.records import NgRecAccess, NgRecMap, NgRecType  # noqa: E402

BAR = 0xFEB4_0000
BAR_LEN = 0x20000
HEADER = "VERSION 20070824\n"


def scenario(n: int, boot: int) -> Iterator[tuple[str, int, int, int]]:
    """The accesses (op "R"/"W", width, offset, value) of a driver: register
    reads and writes, and status polls (one read repeated).  The same for
    every boot, except for how often each poll spins (boot picks that); n
    of them for boot 0, about as many for the others."""
    rng = random.Random(7)              # the driver: the same on every boot
    spins = random.Random(100 + boot)   # the hardware's timing: not
    done = 0                            # accesses of boot 0
    while done < n:
        if rng.random() < 0.1:
            reps = min(rng.randrange(2, 40), n - done)
            off, value = 4 * rng.randrange(64), rng.getrandbits(32)
            done += reps
            if boot:
                reps = max(1, reps + spins.randrange(-1, 3))
            for _ in range(reps):
                yield "R", 4, off, value
        else:
            op = "R" if rng.random() < 0.55 else "W"
            yield op, 4, 4 * rng.randrange(0x800), rng.getrandbits(32)
            done += 1


def synthetic_lines(n: int, boot: int = 0) -> Iterator[str]:
    """A text trace of scenario(n, boot): one MAP line, then the accesses,
    with this boot's timestamps, map id, virtual address, pc and pid."""
    clock = random.Random(boot)
    map_id = 1 + boot
    virt = 0xFFFF_C900_0060_0000 + boot * 0x10_0000
    pc = 0xFFFF_FFFF_C05A_3CC0 + boot * 0x1000
    usecs = 25_000_000 + boot * 7_777_777
    yield HEADER
    yield f"MAP {usecs // 10**6}.{usecs % 10**6:06d} {map_id} 0x{BAR:x} 0x{virt:x} " \
          f"0x{BAR_LEN:x} 0x0 0\n"
    for op, width, off, value in scenario(n, boot):
        usecs += clock.randrange(1, 400)
        yield (f"{op} {width} {usecs // 10**6}.{usecs % 10**6:06d} {map_id} "
               f"0x{BAR + off:x} 0x{value:x} 0x{pc + off % 97:x} {boot}\n")


def write_recording(path: str, n: int, boot: int = 0) -> None:
    """A recorded file of scenario(n, boot) (a MAP record, then access records)."""
    clock = random.Random(boot)
    ns = 25_000_000_000 + boot * 7_777_777_000
    m = NgRecMap(phys=BAR, virt=0xFFFF_C900_0060_0000 + boot * 0x10_0000, len=BAR_LEN,
                 map_id=1 + boot)
    m.hdr.type, m.hdr.ts_ns = NgRecType.NG_REC_MAP, ns
    rec = NgRecAccess(map_id=1 + boot, pid=boot, width=4, compat_width=4, insn_len=2)
    rec.hdr.type = NgRecType.NG_REC_ACCESS
    w = rawfile.RawWriter(path)
    w.header(HEADER)
    batch = [bytes(m)]
    for op, width, off, value in scenario(n, boot):
        ns += clock.randrange(1000, 400_000)
        rec.hdr.ts_ns = ns
        rec.phys, rec.value = BAR + off, value
        rec.compat_value = value
        rec.op = rec.compat_op = MMIOTNG_OP_READ if op == "R" else MMIOTNG_OP_WRITE
        rec.width = rec.compat_width = width
        rec.ip = 0xFFFF_FFFF_C05A_3CC0 + boot * 0x1000 + off % 97
        batch.append(bytes(rec)[:ctypes.sizeof(NgRecAccess)])
        if len(batch) == 65536:
            w.records(batch)
            batch = []
    w.records(batch)
    w.end(0, 0, None, None)
    w.close()


def _args(a: str, b: str, **opts: object) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    diff.setup(ap)
    args = ap.parse_args([a, b])
    for k, v in opts.items():
        setattr(args, k, v)
    return args


def time_diff(a: str, b: str, repeat: int = 3, **opts: object) -> tuple[float, int, bytes]:
    """(best CPU seconds, exit status, output) of diff.diff(a, b)."""
    best, status, out = float("inf"), -1, b""
    for _ in range(repeat):
        sink = io.BytesIO()
        start = time.process_time()
        status = diff.diff(_args(a, b, **opts), sink)
        best = min(best, time.process_time() - start)
        out = sink.getvalue()
    return best, status, out


def bench_diff(n: int = 1_000_000, repeat: int = 3) -> dict[str, float]:
    """Records (of one trace) per second for each kind of input pair."""
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for boot in (0, 1):
            with open(f"{tmp}/{boot}.txt", "w") as fh:
                fh.writelines(synthetic_lines(n, boot))
            write_recording(f"{tmp}/{boot}.raw", n, boot)
        for kind in ("txt", "raw"):
            a, b = f"{tmp}/0.{kind}", f"{tmp}/1.{kind}"
            spent, status, out = time_diff(a, b, repeat)
            if status != 0 or out:
                raise RuntimeError(f"bench_diff: {kind} traces compared as different")
            rates[kind] = n / spent
            spent, status, _ = time_diff(a, b, repeat, exact_counts=True)
            if status != 1:
                raise RuntimeError("bench_diff: polls of other counts compared equal")
            rates[f"{kind} --exact-counts"] = n / spent
    return rates


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    for kind, rate in bench_diff(count).items():
        print(f"diff of two {kind} traces ({count} records each): {rate:,.0f} records/s")
