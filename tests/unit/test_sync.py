"""--sync on the tracer's side: the newest stamp of what a drain wrote, and
the order of the write, the flush to the disk and the acknowledgment."""

from __future__ import annotations

import argparse
import ctypes
import os

from mmiotrace_ng.common import ringbuf
from mmiotrace_ng.format.records import NgRecAccess, NgRecMark, NgRecType
from mmiotrace_ng.tracer import session


def access(ts: int, cpu: int) -> bytes:
    rec = NgRecAccess()
    rec.hdr.ts_ns, rec.hdr.type, rec.hdr.cpu = ts, NgRecType.NG_REC_ACCESS, cpu
    return bytes(rec)


def test_newest_stamps_are_each_cpus_largest_of_the_drained_records():
    mark = NgRecMark()
    mark.hdr.ts_ns, mark.hdr.type, mark.hdr.cpu, mark.len = 90, NgRecType.NG_REC_MARK, 3, 0
    image = ringbuf.pack([access(30, 0), access(70, 1), bytes(mark)[:ctypes.sizeof(mark) - 4096],
                          access(40, 0), access(60, 1)])
    assert session.newest_stamps(memoryview(image)) == {0: 40, 1: 70, 3: 90}
    assert session.newest_stamps(memoryview(b"")) == {}


class FakeHelper:
    def __init__(self, log: list) -> None:
        self.log = log

    def sync_ack(self, cpu: int, ts: int) -> None:
        self.log.append(("ack", cpu, ts))


def test_synced_flushes_the_files_to_the_disk_before_it_acknowledges(tmp_path, monkeypatch):
    log: list = []
    real = os.fdatasync
    monkeypatch.setattr(session.os, "fdatasync",
                        lambda fd: (log.append(("fdatasync", os.readlink(f"/proc/self/fd/{fd}"))),
                                    real(fd)))
    args = argparse.Namespace(compat=False, pc=False, pid=False, irq=False, dma=False,
                              sync=True)
    with open(tmp_path / "out.txt", "wb") as out:
        s = session.Session(args, out)
        s.helper = FakeHelper(log)
        s.synced({1: 1234, 0: 99})
    assert log == [("fdatasync", str(tmp_path / "out.txt")), ("ack", 0, 99), ("ack", 1, 1234)]


def test_synced_to_a_pipe_acknowledges_without_a_flush(monkeypatch):
    log: list = []
    r, w = os.pipe()
    args = argparse.Namespace(compat=False, pc=False, pid=False, irq=False, dma=False,
                              sync=True)
    with os.fdopen(w, "wb") as out:
        s = session.Session(args, out)
        s.helper = FakeHelper(log)
        s.synced({0: 99})
    os.close(r)
    assert log == [("ack", 0, 99)]
