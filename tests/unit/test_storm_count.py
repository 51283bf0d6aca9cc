"""The storm's reader and verdict (tests/guest/storm_count.py) must fail on
the broken outputs it exists to catch: a record doubled or dropped, a loss
under-reported, a stray line, a summary that disagrees, a bad exit status;
and lines split across reads must count once."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "guest"))

from storm_count import LineCounter, verdict  # noqa: E402

BURSTS, COUNT, LOST = 3, 5, 4
MADE = BURSTS * (2 * COUNT + 2)


def output(lost: int = LOST) -> list[bytes]:
    """A tracer's output for BURSTS bursts of 2*COUNT reads, each burst a
    MAP, its reads and an UNMAP; `lost` reads of the second burst are
    replaced by one loss line."""
    out = [b"VERSION 20070824",
           b"PCIDEV 0018\t123411e8\t0\tfea00000\t0\t0\t0\t0\t0\t0\t100000\t0\t0\t0\t0\t0\t0\t0\t "]
    for b in range(BURSTS):
        out.append(f"MAP 1.{b:06d} {b + 1} 0xfea00000 0xffffc90000400000 0x100000 0x0 0".encode())
        reads = [f"R 4 1.{b:06d} {b + 1} 0xfea00000 0x10000ed 0x0 0".encode()
                 for _ in range(2 * COUNT)]
        if b == 1:
            reads[2:2 + lost] = [f"MARK 0.000000 Lost {lost} events.".encode()]
        out += reads
        out.append(f"UNMAP 1.{b:06d} {b + 1} 0x0 0".encode())
    return out


def summary(lines: list[bytes], lost: int = LOST) -> str:
    access = sum(ln.startswith(b"R ") for ln in lines)
    return (f"mmiotrace-ng: ready, tracing 0000:00:03.0\nmmiotrace-ng: {access + 2 * BURSTS} "
            f"records (map {BURSTS}, unmap {BURSTS}, access {access}, mark 0), lost {lost}\n")


class Chunks(io.RawIOBase):
    """A pipe that hands out `size` bytes per read."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size = data, size

    def read1(self, n: int = -1) -> bytes:
        chunk, self.data = self.data[:self.size], self.data[self.size:]
        return chunk


def judge(lines: list[bytes], stderr: str, status: int = 0, size: int = 1 << 20,
          made: int = MADE) -> list[str]:
    counter = LineCounter(Chunks(b"\n".join(lines) + b"\n", size))
    counter.run()
    return verdict(counter, made, status, stderr)


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
def test_a_whole_output_passes_however_it_is_read(size):
    lines = output()
    assert judge(lines, summary(lines), size=size) == []


def test_doubled_record_fails():
    lines = output()
    lines.insert(5, lines[5])
    assert any("!= made" in f for f in judge(lines, summary(lines)))


def test_dropped_record_fails():
    lines = output()
    del lines[5]
    assert any("!= made" in f for f in judge(lines, summary(lines)))


def test_under_reported_loss_fails():
    lines = output()
    lines = [ln.replace(b"Lost 4 events", b"Lost 3 events") for ln in lines]
    assert any("!= made" in f for f in judge(lines, summary(lines, 3)))


def test_summary_that_disagrees_fails():
    lines = output()
    assert any("summary disagrees" in f for f in judge(lines, summary(lines, LOST + 1)))
    assert any("summary disagrees" in f for f in judge(lines, "mmiotrace-ng: ready\n"))


@pytest.mark.parametrize("junk", [b"R 4 garbage", b"Traceback (most recent call last):",
                                  b"", b"VERSION 20070824"])
def test_stray_line_fails(junk):
    lines = output()
    lines.insert(7, junk)
    assert judge(lines, summary(lines))


def test_bad_exit_status_fails():
    lines = output()
    assert any("exited 1" in f for f in judge(lines, summary(lines), status=1))
