"""records.parse: validation of raw records (the layout itself is test_abi.py's)."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import pytest

from mmiotrace_ng.format import records
from mmiotrace_ng.format.records import (
    NG_MARK_MAX,
    PAD_SLACK,
    BadRecord,
    NgRecAccess,
    NgRecMap,
    NgRecMark,
    NgRecType,
    NgRecUnmap,
    field,
    mark_text,
    parse,
    unpacker,
)

REPO = Path(__file__).resolve().parents[2]


def access(**kw: int) -> NgRecAccess:
    rec = NgRecAccess()
    rec.hdr.type = NgRecType.NG_REC_ACCESS
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


def fixed_records() -> list[ctypes.Structure]:
    a = access(phys=0xFEA00004, value=0x12345678, compat_value=0x12345678, map_id=1)
    a.hdr.ts_ns, a.hdr.lost, a.hdr.cpu = 27_267_138_000, 2, 1
    a.width = a.compat_width = 4
    a.op = a.compat_op = 1
    a.insn[:] = [0x89, 0x10, 0, 0, 0, 0, 0, 0]
    a.insn_len = 2
    m = NgRecMap(phys=0xFEA00000, virt=0xFF54AAC240800000, len=0x100000, map_id=1)
    m.hdr.type = NgRecType.NG_REC_MAP
    u = NgRecUnmap(virt=0xFF54AAC240800000, map_id=-1)
    u.hdr.type = NgRecType.NG_REC_UNMAP
    return [a, m, u]


def mark_raw(text: bytes, *, full: bool = False, length: int | None = None) -> bytes:
    rec = NgRecMark(len=len(text) if length is None else length, pid=42)
    rec.hdr.type = NgRecType.NG_REC_MARK
    rec.hdr.ts_ns = 27_430_042_000
    ctypes.memmove(ctypes.addressof(rec) + NgRecMark.text.offset, text, len(text))
    raw = bytes(rec)
    return raw if full else raw[: NgRecMark.text.offset + len(text)]


def test_header_layout_by_hand() -> None:
    """The 16-byte header as the BPF side writes it (u64 ts, u32 lost, u16 type, u16 cpu)."""
    raw = struct.pack("<QIHH", 123, 7, NgRecType.NG_REC_UNMAP, 3) + struct.pack(
        "<QQiI", 0xFFFF888000000000, 0xFFFFFFFFC0001234, -1, 99
    )
    rec = parse(raw)
    assert isinstance(rec, NgRecUnmap)
    assert (rec.hdr.ts_ns, rec.hdr.lost, rec.hdr.type, rec.hdr.cpu) == (123, 7, 2, 3)
    assert (rec.virt, rec.ip, rec.map_id, rec.pid) == (
        0xFFFF888000000000,
        0xFFFFFFFFC0001234,
        -1,
        99,
    )


@pytest.mark.parametrize("rec", fixed_records(), ids=lambda r: type(r).__name__)
def test_roundtrip(rec: ctypes.Structure) -> None:
    raw = bytes(rec)
    for buf in (raw, bytearray(raw), memoryview(raw)):
        got = parse(buf)
        assert type(got) is type(rec)
        assert bytes(got) == raw


@pytest.mark.parametrize("rec", fixed_records(), ids=lambda r: type(r).__name__)
def test_truncated(rec: ctypes.Structure) -> None:
    raw = bytes(rec)
    for n in range(len(raw)):
        with pytest.raises(BadRecord):
            parse(raw[:n])


@pytest.mark.parametrize("rec", fixed_records(), ids=lambda r: type(r).__name__)
def test_padding_slack(rec: ctypes.Structure) -> None:
    raw = bytes(rec)
    # a perf-buffer sample of 72 bytes arrives as 76: tolerated, ignored
    assert bytes(parse(raw + b"\xaa" * 4)) == raw
    assert bytes(parse(raw + b"\0" * (PAD_SLACK - 1))) == raw
    with pytest.raises(BadRecord, match="expected"):
        parse(raw + b"\0" * PAD_SLACK)


@pytest.mark.parametrize("rtype", [0, 8, 0x100, 0xFFFF])
def test_unknown_type(rtype: int) -> None:
    raw = bytearray(bytes(fixed_records()[0]))
    struct.pack_into("<H", raw, NgRecAccess.hdr.offset + 12, rtype)
    with pytest.raises(BadRecord, match=f"unknown record type {rtype}"):
        parse(raw)


@pytest.mark.parametrize("field", ["op", "compat_op"])
@pytest.mark.parametrize("value", [3, 0x80, 0xFF])
def test_bad_op(field: str, value: int) -> None:
    rec = fixed_records()[0]
    setattr(rec, field, value)
    with pytest.raises(BadRecord, match=field):
        parse(bytes(rec))


@pytest.mark.parametrize("op", [0, 1, 2])
def test_valid_ops(op: int) -> None:
    rec = fixed_records()[0]
    rec.op = rec.compat_op = op
    assert parse(bytes(rec)).op == op


def test_short_header() -> None:
    for n in range(records.HDR_SIZE):
        with pytest.raises(BadRecord, match="truncated"):
            parse(b"\x03" * n)


def test_bad_record_is_value_error() -> None:
    assert issubclass(BadRecord, ValueError)


class TestMark:
    def test_short_form(self) -> None:
        rec = parse(mark_raw(b"hello\n"))
        assert isinstance(rec, NgRecMark)
        assert (rec.len, rec.pid, rec.hdr.ts_ns) == (6, 42, 27_430_042_000)
        assert mark_text(rec) == b"hello\n"

    def test_full_size(self) -> None:
        rec = parse(mark_raw(b"hello", full=True))
        assert mark_text(rec) == b"hello"

    def test_text_keeps_nuls_and_high_bytes(self) -> None:
        text = b"a\0b\xff\n"
        assert mark_text(parse(mark_raw(text))) == text

    def test_max_length(self) -> None:
        text = bytes(range(256)) * (NG_MARK_MAX // 256)
        assert len(text) == NG_MARK_MAX
        assert mark_text(parse(mark_raw(text))) == text

    def test_length_beyond_max(self) -> None:
        with pytest.raises(BadRecord, match="NG_MARK_MAX"):
            parse(mark_raw(b"x", full=True, length=NG_MARK_MAX + 1))

    def test_length_beyond_buffer(self) -> None:
        raw = mark_raw(b"hello")
        with pytest.raises(BadRecord, match="truncated"):
            parse(raw[:-1])

    def test_truncated_before_text(self) -> None:
        raw = mark_raw(b"")
        assert len(raw) == NgRecMark.text.offset
        assert mark_text(parse(raw)) == b""
        with pytest.raises(BadRecord, match="truncated"):
            parse(raw[:-1])

    def test_too_long(self) -> None:
        raw = mark_raw(b"x", full=True)
        with pytest.raises(BadRecord):
            parse(raw + bytes(PAD_SLACK))


def test_field_gives_the_mirror_offsets() -> None:
    rec = fixed_records()[0]
    raw = bytes(rec)
    got = {}
    for path in ("hdr.ts_ns", "hdr.type", "phys", "map_id", "insn"):
        offset, code = field(NgRecAccess, path)
        got[path] = struct.unpack_from("<" + code, raw, offset)[0]
    assert got == {
        "hdr.ts_ns": 27_267_138_000,
        "hdr.type": 3,
        "phys": 0xFEA00004,
        "map_id": 1,
        "insn": bytes(rec.insn),
    }
    assert field(NgRecAccess, "map_id")[1] == "i"
    assert field(NgRecMap, "hdr.lost") == (NgRecMap.hdr.offset + 8, "I")


def test_field_rejects_unknown_names() -> None:
    with pytest.raises(KeyError):
        field(NgRecAccess, "nope")
    with pytest.raises(KeyError):
        field(NgRecAccess, "hdr.nope")
    with pytest.raises(TypeError):
        field(NgRecAccess, "hdr")


def test_unpacker_reads_the_mirror_offsets() -> None:
    rec = fixed_records()[0]
    s = unpacker(
        NgRecAccess, ["hdr.ts_ns", "hdr.type", "phys", "map_id", ("width", "I"), "insn"]
    )
    assert s.size == ctypes.sizeof(NgRecAccess)
    ts, rtype, phys, map_id, opbytes, insn = s.unpack(bytes(rec))
    assert (ts, rtype, phys, map_id) == (27_267_138_000, 3, 0xFEA00004, 1)
    assert (
        opbytes
        == rec.width | rec.op << 8 | rec.compat_width << 16 | rec.compat_op << 24
    )
    assert insn == bytes(rec.insn)


def test_unpacker_rejects_bad_specs() -> None:
    with pytest.raises(ValueError, match="order"):
        unpacker(NgRecAccess, ["phys", "hdr.ts_ns"])
    with pytest.raises(KeyError):
        unpacker(NgRecAccess, ["nope"])
    with pytest.raises(ValueError, match="past the end"):
        unpacker(NgRecUnmap, [("pid", "Q")])
