"""A BPF program's runs that the kernel skipped (recursion_misses) are
records lost: the session's end says them as lost, in the text and in the
summary's count, with the ring buffer's own drops."""

from __future__ import annotations

import argparse
import io

from mmiotrace_ng.format.render import lost_line
from mmiotrace_ng.tracer.session import Session


class FakeProbes:
    def __init__(self, drops: tuple[int, int], misses: int | OSError) -> None:
        self._drops = drops
        self._misses = misses

    def pending(self, timeout_ms: int) -> memoryview:
        return memoryview(b"")

    def drops(self) -> tuple[int, int]:
        return self._drops

    def misses(self) -> int:
        if isinstance(self._misses, OSError):
            raise self._misses
        return self._misses


def finish(drops: tuple[int, int], misses: int | OSError) -> tuple[str, int]:
    args = argparse.Namespace(compat=False, pc=False, pid=False, histogram=False, irq=False,
                              dma=False)
    out = io.BytesIO()
    session = Session(args, out)
    session.probes = FakeProbes(drops, misses)    # type: ignore[assignment]
    session.finish()
    return out.getvalue().decode(), session.renderer.lost


def test_skipped_runs_are_lost_records():
    assert finish((0, 0), 3) == (lost_line(3), 3)


def test_with_the_ring_buffers_drops():
    # 5 dropped in all, 2 of them not said by a record yet: 2 + 3 said here
    assert finish((5, 2), 3) == (lost_line(5), 8)


def test_none_skipped_none_said():
    assert finish((0, 0), 0) == ("", 0)


def test_counters_that_cannot_be_read_are_said(capsys):
    assert finish((1, 1), OSError(13, "Permission denied")) == (lost_line(1), 1)
    err = capsys.readouterr().err
    assert err == ("mmiotrace-ng: cannot read the BPF programs' skipped runs (Permission "
                   "denied): records lost that way are not counted\n")
