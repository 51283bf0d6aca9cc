"""Recorded traces (rawfile.py) and the ring walk they are copied with
(ringbuf.committed): what record writes, report reads back."""

from __future__ import annotations

import ctypes
import struct
import sys
from pathlib import Path

import pytest

from mmiotrace_ng import cli
from mmiotrace_ng.common import ringbuf
from mmiotrace_ng.format import rawfile
from mmiotrace_ng.format.records import NgRecMap, NgRecMark, NgRecType
from mmiotrace_ng.format.render import Renderer, lost_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from render_bench import synthetic_access_records  # noqa: E402

HEADER = "VERSION 20070824\nPCIDEV 0018 12341234 0 fea00000 0 0 0 0 0 0 100000 0 0 0 0 0 0 \n"
ACCESS = rawfile.ACCESS_SIZE


def a_map(ts: int = 5000) -> bytes:
    rec = NgRecMap()
    rec.hdr.type, rec.hdr.ts_ns = NgRecType.NG_REC_MAP, ts
    rec.map_id, rec.phys, rec.virt, rec.len = 1, 0xFEA00000, 0xFFFFC90000600000, 0x100000
    return bytes(rec)


def a_mark(text: bytes, ts: int = 6000) -> bytes:
    rec = NgRecMark(len=len(text))
    rec.hdr.type, rec.hdr.ts_ns = NgRecType.NG_REC_MARK, ts
    ctypes.memmove(ctypes.addressof(rec) + NgRecMark.text.offset, text, len(text))
    return bytes(rec)[: NgRecMark.text.offset + len(text)]


def discarded(length: int) -> bytes:
    """A record the BPF program reserved and discarded, as the ring holds it."""
    return struct.pack("=II", length | ringbuf.DISCARD, 0) + bytes(ringbuf.stride(length) - 8)


def record_file(path: Path, chunks: list[bytes], end: bool = True) -> None:
    w = rawfile.RawWriter(str(path))
    w.meta({"format": 2, "kernel": "6.1.0-test"})
    w.header(HEADER)
    for chunk in chunks:
        w.ring(memoryview(chunk))
    if end:
        w.end(7, 3, "ffffffffc0001000 t sc_readl\t[edu_exerciser]\n", "edu_exerciser 16384 0\n")
    w.close()


def test_a_recording_gives_back_every_section(tmp_path):
    recs = [a_map(), *synthetic_access_records(300), a_mark(b"hi\n")]
    first = ringbuf.pack(recs[:100]) + discarded(ACCESS)
    record_file(tmp_path / "r", [first, ringbuf.pack(recs[100:])])
    rec = rawfile.open_recording(str(tmp_path / "r"))
    assert (rec.format, rec.meta["kernel"], rec.header) == (2, "6.1.0-test", HEADER)
    assert rec.end == {"lost": 7, "pending": 3} and rec.pending_lost == 3
    assert rec.kallsyms.endswith("sc_readl\t[edu_exerciser]\n")
    assert rec.modules == "edu_exerciser 16384 0\n"
    assert rawfile.read_raw(str(tmp_path / "r")) == (HEADER, recs)


def test_report_prints_what_the_live_tracer_prints(tmp_path, capsys):
    """The header, every record as the renderer renders it, and the Lost line
    of the drops no record reported (the live tracer's last line)."""
    recs = [a_map(), *synthetic_access_records(5000), a_mark(b"done\n")]
    record_file(tmp_path / "r", [ringbuf.pack(recs[:2500]), ringbuf.pack(recs[2500:])])
    for opts in ([], ["--compat", "--pc", "--pid"]):
        assert cli.main(["report", *opts, str(tmp_path / "r")]) == 0
        out, err = capsys.readouterr()
        want = Renderer(*(bool(opts),) * 3).feed_batch(recs)
        assert (out, err) == (HEADER + want + lost_line(3), "")


def test_report_of_a_killed_recording_keeps_its_whole_records(tmp_path, capsys):
    """A tracer killed while writing leaves a RING section cut short: the
    whole records in its blocks that are whole (and match their checksums)
    are printed, and stderr says the file is cut short."""
    recs = synthetic_access_records(3000)
    record_file(tmp_path / "r", [ringbuf.pack(recs)], end=False)
    data = (tmp_path / "r").read_bytes()
    stride = ringbuf.stride(ACCESS)
    assert len(recs) * stride > 3 * rawfile.SUM_BLOCK
    (tmp_path / "r").write_bytes(data[: len(data) - 40 * stride - 10])
    kept = 3 * rawfile.SUM_BLOCK // stride          # the blocks before the torn last one
    assert rawfile.read_raw(str(tmp_path / "r"))[1] == recs[:kept]
    assert cli.main(["report", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert out == HEADER + Renderer().feed_batch(recs[:kept])
    torn = (len(recs) - 40) * stride - 10 - 3 * rawfile.SUM_BLOCK     # the last block's bytes
    assert "cut short" in err and f" {torn} bytes of records fail their checksums" in err


def test_a_section_whose_tail_was_overwritten_keeps_only_its_verified_blocks(tmp_path, capsys):
    """What a kill left on a 9p file system: the section's last bytes are
    other records of the ring, written over the ones copied (a record torn
    in the middle, its fields made of the next one's).  Only whole blocks
    that match their checksums are printed; nothing made up is."""
    recs = synthetic_access_records(3000)
    stride = ringbuf.stride(ACCESS)
    image = ringbuf.pack(recs)
    tear = 2 * rawfile.SUM_BLOCK + 7 * stride + 48          # inside a record's data
    later = ringbuf.pack(synthetic_access_records(3000)[::-1])
    record_file(tmp_path / "r", [ringbuf.pack(recs[:10]), image], end=False)
    data = (tmp_path / "r").read_bytes()
    at = data.rindex(image)
    left = len(image) - tear - 9000
    (tmp_path / "r").write_bytes(data[: at + tear] + later[:left])
    kept = 2 * rawfile.SUM_BLOCK // stride
    assert rawfile.read_raw(str(tmp_path / "r"))[1] == recs[:10] + recs[:kept]
    assert cli.main(["report", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert out == HEADER + Renderer().feed_batch(recs[:10] + recs[:kept])
    assert f" {tear + left - 2 * rawfile.SUM_BLOCK} bytes of records fail their checksums" in err
    assert "corrupt" not in err


def test_a_damaged_block_in_the_middle_is_left_out_and_said(tmp_path, capsys):
    recs = synthetic_access_records(2000)
    record_file(tmp_path / "r", [ringbuf.pack(recs[:1000]), ringbuf.pack(recs[1000:])])
    data = bytearray((tmp_path / "r").read_bytes())
    data[data.index(ringbuf.pack(recs[:1])) + 100] ^= 1      # a bit flipped in block 0
    (tmp_path / "r").write_bytes(bytes(data))
    # the section's records from the damaged block on: the ones after it
    # cannot be told from the bytes of a record that straddles it
    assert rawfile.read_raw(str(tmp_path / "r"))[1] == recs[1000:]
    assert cli.main(["report", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert out == HEADER + Renderer().feed_batch(recs[1000:]) + lost_line(3)
    assert err == (f"mmiotrace-ng: {tmp_path / 'r'}: {1000 * ringbuf.stride(ACCESS)} bytes of "
                   "records fail their checksums and are left out\n")


def test_format_1_files_are_still_read(tmp_path):
    recs = [a_map(), *synthetic_access_records(10)]
    frames = [HEADER.encode(), *recs]
    (tmp_path / "old").write_bytes(rawfile.RAW1_MAGIC + b"".join(
        struct.pack("<I", len(f)) + f for f in frames))
    rec = rawfile.open_recording(str(tmp_path / "old"))
    assert (rec.format, rec.header, rec.end) == (1, HEADER, None)
    assert rawfile.read_raw(str(tmp_path / "old")) == (HEADER, recs)


def test_other_files_are_not_recordings(tmp_path, capsys):
    (tmp_path / "t.txt").write_text(HEADER)
    with pytest.raises(rawfile.NotRawFile):
        rawfile.open_recording(str(tmp_path / "t.txt"))
    assert cli.main(["report", str(tmp_path / "t.txt")]) == 2
    assert capsys.readouterr().err == (f"mmiotrace-ng: {tmp_path / 't.txt'} is not a trace "
                                       "recorded by mmiotrace-ng\n")


def test_committed_counts_runs_and_stops_before_unfinished_records():
    accesses = synthetic_access_records(50)
    image = ringbuf.pack([*accesses[:20], a_map(), *accesses[20:]]) + discarded(64)
    busy = struct.pack("=II", ringbuf.BUSY | ACCESS, 0) + bytes(ringbuf.stride(ACCESS) - 8)
    view = memoryview(image + busy + ringbuf.pack(accesses[:3]))
    used, runs, others = ringbuf.committed(view, ACCESS)
    assert (used, runs) == (len(image), 50)
    assert [bytes(o) for o in others] == [a_map()]
    # a copy that ends inside a record: only the whole ones before it
    used, runs, _ = ringbuf.committed(view[: len(image) - 70 - ringbuf.stride(64)], ACCESS)
    assert runs == 49 and used == ringbuf.stride(ACCESS) * 49 + ringbuf.stride(len(a_map()))
    # a limit: about that many records
    assert ringbuf.committed(view, ACCESS, 10)[:2] == (10 * ringbuf.stride(ACCESS), 10)


def test_a_damaged_section_is_said_not_raised(tmp_path, capsys):
    record_file(tmp_path / "r", [ringbuf.pack(synthetic_access_records(3))])
    data = (tmp_path / "r").read_bytes()
    meta = data.index(b"META") + 8
    (tmp_path / "r").write_bytes(data[:meta] + b"!" + data[meta + 1:])   # JSON no more
    assert cli.main(["report", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.startswith(
        f"mmiotrace-ng: {tmp_path / 'r'}: its META section is damaged (")
    from mmiotrace_ng.analysis.tracefile import Trace, TraceError
    with pytest.raises(TraceError, match="META section is damaged"):
        Trace(str(tmp_path / "r"))


def test_text_without_newlines_is_read_in_bounded_pieces(tmp_path):
    from mmiotrace_ng.analysis.tracefile import TEXT_CHUNK, Trace

    (tmp_path / "junk").write_bytes(b"VERSION 20070824\n" + b"x" * (3 * TEXT_CHUNK + 5))
    chunks = list(Trace(str(tmp_path / "junk")).chunks())
    assert max(len(line) for c in chunks for line in c) <= 2 * TEXT_CHUNK
    assert sum(len(line.rstrip("\n")) for c in chunks for line in c) == 3 * TEXT_CHUNK + 5 + 16
