"""The guest tests' stream comparison helpers must see the differences
they exist to catch (tests/guest/kernel_tracer.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "guest"))

from kernel_tracer import device_stream, normalize  # noqa: E402

BAR = [(0xFEBC0000, 0x20000)]
STREAM = """VERSION 20070824
MAP 1.000000 1 0xfebc0000 0xffffc90000100000 0x20000 0x0 0
R 4 1.000001 1 0xfebc0008 0x80080783 0x0 0
R 4 1.000002 1 0xfebc0008 0x80080783 0x0 0
R 4 1.000003 1 0xfebc0008 0x80080783 0x0 0
W 4 1.000004 1 0xfebc00d8 0xffffffff 0x0 0
W 4 1.000005 1 0xfebc00d8 0xffffffff 0x0 0
MAP 1.000006 2 0xfed00000 0xffffc90000200000 0x400 0x0 0
R 4 1.000007 2 0xfed000f0 0x1234 0x0 0
MARK 1.000008 in the middle
UNMAP 1.000009 2 0x0 0
UNMAP 1.000010 1 0x0 0
"""


def lines_changed(text: str, old: str, new: str, count: int = 1) -> str:
    assert old in text
    return text.replace(old, new, count)


def test_device_stream_counts_every_read_and_write():
    recs = device_stream(STREAM, BAR)
    read, write = ("R", 4, (0, 8), 0x80080783, 0), ("W", 4, (0, 0xD8), 0xFFFFFFFF, 0)
    assert recs == [("MAP", 0, 0, 0x20000), read, read, read, write, write,
                    ("MARK", "in the middle"), ("UNMAP",)]


def test_device_stream_sees_a_dropped_or_doubled_access():
    for line in ("W 4 1.000005 1 0xfebc00d8 0xffffffff 0x0 0\n",
                 "R 4 1.000002 1 0xfebc0008 0x80080783 0x0 0\n"):
        dropped = lines_changed(STREAM, line, "")
        doubled = lines_changed(STREAM, line, line * 2)
        assert device_stream(dropped, BAR) != device_stream(STREAM, BAR)
        assert device_stream(doubled, BAR) != device_stream(STREAM, BAR)


def test_device_stream_sees_other_records_and_junk():
    base = device_stream(STREAM, BAR)
    no_unmap = lines_changed(STREAM, "UNMAP 1.000010 1 0x0 0\n", "")
    no_mark = lines_changed(STREAM, "MARK 1.000008 in the middle\n", "")
    junk = lines_changed(STREAM, "MARK 1.000008 in the middle\n", "R 4 garbage\n")
    lost = STREAM + "MARK 0.000000 Lost 3 events.\n"
    value = lines_changed(STREAM, "0x80080783 0x0 0\nW", "0x80080784 0x0 0\nW")
    for other in (no_unmap, no_mark, junk, lost, value):
        assert device_stream(other, BAR) != base
    assert ("?", "R 4 garbage") in device_stream(junk, BAR)
    assert len(device_stream(value, BAR)) == len(base)


def test_device_stream_leaves_out_other_mappings():
    other = lines_changed(STREAM, "0xfed000f0 0x1234", "0xfed000f0 0x9")
    assert device_stream(other, BAR) == device_stream(STREAM, BAR)


def test_normalize_keeps_every_value_that_matters():
    base = normalize(STREAM)
    for old, new in (("0x80080783 0x0 0\nR 4 1.000003", "0x80080782 0x0 0\nR 4 1.000003"),
                     ("W 4 1.000004 1 0xfebc00d8", "W 2 1.000004 1 0xfebc00d8"),
                     ("W 4 1.000004 1 0xfebc00d8", "W 4 1.000004 1 0xfebc00dc"),
                     ("0xffffffff 0x0 0\nW", "0xffffffff 0x10 0\nW"),
                     ("0xffffffff 0x0 0\nW", "0xffffffff 0x0 7\nW"),
                     ("UNMAP 1.000009 2", "UNMAP 1.000009 1"),
                     ("in the middle", "in the muddle")):
        assert normalize(lines_changed(STREAM, old, new)) != base, (old, new)
    # only times, map ids and virtual addresses are run-dependent
    shifted = STREAM.replace(" 1.0000", " 7.0000").replace(" 1 0x", " 5 0x")
    shifted = shifted.replace("0xffffc90000100000", "0xffffc90000900000")
    assert normalize(shifted) == base
