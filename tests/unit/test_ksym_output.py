"""ksym's output from records, without a kernel: the line per hit, the
loss lines, the histogram table (a fake ring buffer stands in for BPF)."""

from __future__ import annotations

import argparse
import io

from mmiotrace_ng.common.ringbuf import pack
from mmiotrace_ng.common.symbols import Kallsyms
from mmiotrace_ng.ksym import main as ksym_main
from mmiotrace_ng.ksym.output import Options, header, histogram_table
from mmiotrace_ng.ksym.records import NgKsymHit
from mmiotrace_ng.ksym.request import Watch

SYMS = Kallsyms("""\
ffffffffc0000000 t edu_watch_writer\t[edu_exerciser]
ffffffffc0000040 t edu_watch_reader\t[edu_exerciser]
ffffffffc0000080 t other\t[edu_exerciser]
ffffffffc0002000 b edu_watched\t[edu_exerciser]
""")
W = Watch("edu_exerciser:edu_watched", "edu_exerciser", "edu_watched", 0,
          0xFFFFFFFFC0002000, 4, "W")


class FakeRing:
    def __init__(self, image: bytes) -> None:
        self.buf = memoryview(bytearray(image))
        self.pos = 0

    def pending(self) -> memoryview:
        return self.buf[self.pos:]

    def wait(self, timeout_ms: int) -> None:
        pass

    def consume(self, n: int) -> None:
        self.pos += n


class FakeProbes:
    def __init__(self, hits: list[NgKsymHit]) -> None:
        self.ring = FakeRing(pack(bytes(h) for h in hits))

    def drops(self) -> tuple[int, int]:
        return 3, 0


def hit(ip: int, value: int, lost: int = 0) -> NgKsymHit:
    return NgKsymHit(ts_ns=5_000_123_456, ip=ip, value=value, lost=lost, pid=42, cpu=1,
                     slot=0, comm=b"sh")


def session(hits: list[NgKsymHit], opts: Options) -> tuple[ksym_main.Run, io.BytesIO]:
    run = ksym_main.Run.__new__(ksym_main.Run)
    out = io.BytesIO()
    run.args = argparse.Namespace(histogram=False)
    run.watches, run.syms, run.out, run.opts = [W], SYMS, out, opts
    run.probes = FakeProbes(hits)
    run.records, run.lost, run.stop = [0], 0, False
    return run, out


def test_a_line_per_hit_and_the_losses_where_they_were():
    run, out = session([hit(0xFFFFFFFFC0000010, 0x1_0000_0007), hit(0xFFFFFFFFC0000011, 8, 3)],
                       Options())
    run.finish()
    assert out.getvalue().decode().splitlines() == [
        "sh              42    1   edu_exerciser:edu_watched W "
        "edu_watch_writer+0x10/0x40 [edu_exerciser]",
        "# lost 3 hits",
        "sh              42    1   edu_exerciser:edu_watched W "
        "edu_watch_writer+0x11/0x40 [edu_exerciser]",
    ]
    assert (run.records, run.lost) == ([2], 3)


def test_timestamps_and_values_masked_to_the_watch():
    run, out = session([hit(0xFFFFFFFFC0000050, 0xAAAA_BBBB_0000_0007)],
                       Options(timestamps=True, value=True))
    run.finish()
    assert header(run.opts) == "# TASK-PID CPU# TIMESTAMP Symbol Type Value Function\n"
    (line,) = out.getvalue().decode().splitlines()
    assert line.split() == ["sh", "42", "1", "5.000123", "edu_exerciser:edu_watched", "W",
                            "0x7", "edu_watch_reader+0x10/0x40", "[edu_exerciser]"]


def test_batches_are_drained_to_the_end():
    hits = [hit(0xFFFFFFFFC0000010, i) for i in range(ksym_main.BATCH * 2 + 5)]
    run, out = session(hits, Options())
    run.finish()
    assert run.records == [len(hits)] and out.getvalue().count(b"\n") == len(hits)


def test_histogram_folds_places_into_functions():
    counts = {(0, 0xFFFFFFFFC0000010): 600, (0, 0xFFFFFFFFC0000020): 400,
              (0, 0xFFFFFFFFC0000050): 700}
    rows = histogram_table(counts, [W], SYMS.function).splitlines()
    assert rows[0].split() == ["Access_Type", "Symbol_name", "Function", "Counter"]
    assert [r.split() for r in rows[1:]] == [
        ["W", "edu_exerciser:edu_watched", "edu_watch_writer", "[edu_exerciser]", "1000"],
        ["W", "edu_exerciser:edu_watched", "edu_watch_reader", "[edu_exerciser]", "700"],
    ]

