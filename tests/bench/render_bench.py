"""The renderer's throughput on synthetic access records (host only).

tests/bench/run measures `bench_render(1_000_000)` in each mode; the unit
tests use `synthetic_access_records` as a stream of plausible records.  The
importer puts the repository (for mmiotrace_ng) and this directory on sys.path.
"""

from __future__ import annotations

import functools
import random
import time

from mmiotrace_ng.common import ringbuf
from mmiotrace_ng.format.records import NgRecAccess, NgRecType
from mmiotrace_ng.format.render import Renderer


def synthetic_access_records(n: int, seed: int = 1) -> list[bytes]:
    """n plausible access records (alternating 32-bit reads and writes)."""
    rng = random.Random(seed)
    out = []
    ts = 27_262_255_123
    rec = NgRecAccess()
    rec.hdr.type = NgRecType.NG_REC_ACCESS
    rec.map_id = 1
    rec.ip = 0xFFFF_FFFF_C000_1234
    rec.width = rec.compat_width = 4
    rec.insn_len = 2
    rec.insn[0] = 0x8B
    for i in range(n):
        ts += rng.randrange(100, 50_000)
        rec.hdr.ts_ns = ts
        rec.phys = 0xFEA0_0000 + 4 * (i % 64)
        rec.value = rec.compat_value = rng.getrandbits(32)
        rec.op = rec.compat_op = i & 1
        out.append(bytes(rec))
    return out


@functools.lru_cache(maxsize=1)
def _ring_image(n: int) -> memoryview:
    """synthetic_access_records(n) as the ring buffer holds them."""
    return memoryview(ringbuf.pack(synthetic_access_records(n)))


def bench_render(
    n: int = 200_000,
    compat: bool = False,
    show_pc: bool = False,
    show_pid: bool = False,
    repeat: int = 5,
    batch: int = 16384,
) -> float:
    """Access records per second of Renderer.feed_ring, as the tracer runs it:
    n records laid out as in the ring buffer, rendered at most batch records
    at a time (the CLI's BATCH), each text dropped once counted.  The best of
    `repeat` runs, in CPU time of this process (one core; other load does
    not count)."""
    image = _ring_image(n)
    best = float("inf")
    for _ in range(repeat):
        renderer = Renderer(compat, show_pc, show_pid)
        pos = lines = 0
        spent = 0.0
        while pos < len(image):
            start = time.process_time()
            text, used = renderer.feed_ring(image[pos:], batch)
            spent += time.process_time() - start
            lines += text.count("\n")  # checked, then dropped as when written
            pos += used
        best = min(best, spent)
        if lines != n or renderer.counts[NgRecType.NG_REC_ACCESS] != n:
            raise RuntimeError("bench_render: wrong output")
    return n / best
