"""Python mirror of bpf/mmiotrace_ng.h: the records the BPF programs emit.

The ctypes classes below repeat the header's structs field by field (checked
against the compiled header by tests/unit/test_abi.py).  `parse` turns one raw
ring-buffer record into one of them, validating type and length; anything
corrupt or truncated raises `BadRecord`, which the caller counts.

`field` gives the offset and struct code of a (dotted) field, and `unpacker`
builds precompiled `struct.Struct` readers for a chosen subset of a record's
fields, both from the ctypes layout: the fast render paths
(mmiotrace_ng/format/render.py) read exactly the offsets the mirror declares.
"""

from __future__ import annotations

import ctypes
import struct
from enum import IntEnum
from typing import Final

from mmiotrace_ng.format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_UNKNOWN, MMIOTNG_OP_WRITE

NG_MARK_MAX: Final = 4096
NG_INSN_BYTES: Final = 8
NG_NAME_LEN: Final = 16
NG_TRACED_DEVS: Final = 1024   # devices whose interrupts and DMA are traced, at most
NG_IRQ_LINES: Final = 4096     # their interrupts, at most
NG_ERR_USER_MAP: Final = 66    # -EREMOTE in NgRecUntraced.err: a traced range mapped into a process
NG_USER_RANGES: Final = 256    # traced physical ranges whose mappings into processes are said


class NgRecType(IntEnum):
    """enum ng_rec_type (members keep the C names)."""

    NG_REC_MAP = 1
    NG_REC_UNMAP = 2
    NG_REC_ACCESS = 3
    NG_REC_MARK = 4
    NG_REC_UNTRACED = 5
    NG_REC_IRQ = 6
    NG_REC_DMA = 7


class NgDmaKind(IntEnum):
    """enum ng_dma_kind: the dma tracepoint a DMA record came from."""

    NG_DMA_MAP = 0
    NG_DMA_UNMAP = 1
    NG_DMA_ALLOC = 2
    NG_DMA_FREE = 3
    NG_DMA_MAP_SG = 4
    NG_DMA_UNMAP_SG = 5


#: the op values an access record may carry (MMIOTNG_OP_* of kmod/mmiotng_abi.h)
VALID_OPS: Final = frozenset((MMIOTNG_OP_READ, MMIOTNG_OP_WRITE, MMIOTNG_OP_UNKNOWN))

#: trailing bytes accepted after a fixed-size record (perf-buffer samples are
#: padded so that the u32 size plus the data is a multiple of 8)
PAD_SLACK: Final = 8


class NgConfig(IntEnum):
    """enum ng_config: the slots of the BPF map "config" (u32 each)."""

    NG_CONFIG_TRACER = 0
    NG_CONFIG_ALL = 1
    NG_CONFIG_HISTOGRAM = 2
    NG_CONFIG_SLOTS = 3


NG_CONFIG_TRACER: Final = NgConfig.NG_CONFIG_TRACER
NG_CONFIG_ALL: Final = NgConfig.NG_CONFIG_ALL
NG_CONFIG_HISTOGRAM: Final = NgConfig.NG_CONFIG_HISTOGRAM


class NgRecHdr(ctypes.Structure):
    """struct ng_rec_hdr: common to all records."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("lost", ctypes.c_uint32),
        ("type", ctypes.c_uint16),
        ("cpu", ctypes.c_uint16),
    ]


class NgRecAccess(ctypes.Structure):
    """struct ng_rec_access: R, W, UNKNOWN."""

    _fields_ = [
        ("hdr", NgRecHdr),
        ("phys", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("compat_value", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("map_id", ctypes.c_int32),
        ("pid", ctypes.c_uint32),
        ("width", ctypes.c_uint8),
        ("op", ctypes.c_uint8),
        ("compat_width", ctypes.c_uint8),
        ("compat_op", ctypes.c_uint8),
        ("insn_len", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2),
        ("insn", ctypes.c_uint8 * NG_INSN_BYTES),
    ]


class NgRecMap(ctypes.Structure):
    """struct ng_rec_map: an ioremap the helper armed (with --all: any other too)."""

    _fields_ = [
        ("hdr", NgRecHdr),
        ("phys", ctypes.c_uint64),
        ("virt", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("map_id", ctypes.c_int32),
        ("pid", ctypes.c_uint32),
    ]


class NgRecUnmap(ctypes.Structure):
    """struct ng_rec_unmap: iounmap of a traced mapping."""

    _fields_ = [
        ("hdr", NgRecHdr),
        ("virt", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("map_id", ctypes.c_int32),
        ("pid", ctypes.c_uint32),
    ]


class NgRecMark(ctypes.Structure):
    """struct ng_rec_mark: a write to trace_marker (may arrive truncated to len)."""

    _fields_ = [
        ("hdr", NgRecHdr),
        ("len", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("text", ctypes.c_char * NG_MARK_MAX),
    ]


class NgRecUntraced(ctypes.Structure):
    """struct ng_rec_untraced: a mapping of a traced range the helper left unarmed."""

    _fields_ = [
        ("hdr", NgRecHdr),
        ("phys", ctypes.c_uint64),
        ("virt", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("err", ctypes.c_int32),
        ("pid", ctypes.c_uint32),
    ]


class NgRecIrq(ctypes.Structure):
    """struct ng_rec_irq: a traced device's interrupt handler's entry or exit."""

    _fields_ = [
        ("hdr", NgRecHdr),
        ("irq", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("exit", ctypes.c_uint8),
        ("ret", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 6),
        ("dev", ctypes.c_char * NG_NAME_LEN),
        ("handler", ctypes.c_char * NG_NAME_LEN),
    ]


class NgRecDma(ctypes.Structure):
    """struct ng_rec_dma: a traced device's DMA mapping made or undone."""

    _fields_ = [
        ("hdr", NgRecHdr),
        ("addr", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("phys", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("kind", ctypes.c_uint8),
        ("dir", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2),
        ("dev", ctypes.c_char * NG_NAME_LEN),
    ]


class NgDevName(ctypes.Structure):
    """struct ng_dev_name: a device's name (maps traced_devs, irq_lines)."""

    _fields_ = [("name", ctypes.c_char * NG_NAME_LEN)]


class NgPhysRange(ctypes.Structure):
    """struct ng_phys_range: a traced physical range (map user_ranges)."""

    _fields_ = [("start", ctypes.c_uint64), ("size", ctypes.c_uint64)]


class NgUserMapKey(ctypes.Structure):
    """struct ng_user_map_key: a process's mapping (map user_map_ids)."""

    _fields_ = [("virt", ctypes.c_uint64), ("mm", ctypes.c_uint64)]


class NgUserMapVal(ctypes.Structure):
    """struct ng_user_map_val: its map id and process."""

    _fields_ = [("map_id", ctypes.c_int32), ("tgid", ctypes.c_uint32)]


Record = (NgRecAccess | NgRecMap | NgRecUnmap | NgRecMark | NgRecUntraced | NgRecIrq
          | NgRecDma)

RECORD_CLASSES: Final[dict[NgRecType, type[ctypes.Structure]]] = {
    NgRecType.NG_REC_MAP: NgRecMap,
    NgRecType.NG_REC_UNMAP: NgRecUnmap,
    NgRecType.NG_REC_ACCESS: NgRecAccess,
    NgRecType.NG_REC_MARK: NgRecMark,
    NgRecType.NG_REC_UNTRACED: NgRecUntraced,
    NgRecType.NG_REC_IRQ: NgRecIrq,
    NgRecType.NG_REC_DMA: NgRecDma,
}

# C name -> mirror, for tests/unit/test_abi.py (every struct/enum of the header).
# Module constants named NG_* are mirrors of the header's #defines/enum members.
NG_HIST_ENTRIES: Final = 65536
NG_WAKE_NS: Final = 1_000_000   # access records wake the reader at most this often per CPU


class NgHistKey(ctypes.Structure):
    """struct ng_hist_key: --histogram, one register accessed from one place."""

    _fields_ = [
        ("phys", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("op", ctypes.c_uint8),
        ("width", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 6),
    ]


class NgHistVal(ctypes.Structure):
    """struct ng_hist_val: how often, and the latest value."""

    _fields_ = [
        ("count", ctypes.c_uint64),
        ("last", ctypes.c_uint64),
        ("last_ns", ctypes.c_uint64),
    ]


C_PREFIX: Final = "NG_"
C_STRUCTS: Final[dict[str, type[ctypes.Structure]]] = {
    "ng_rec_hdr": NgRecHdr,
    "ng_rec_access": NgRecAccess,
    "ng_rec_map": NgRecMap,
    "ng_rec_unmap": NgRecUnmap,
    "ng_rec_mark": NgRecMark,
    "ng_rec_untraced": NgRecUntraced,
    "ng_rec_irq": NgRecIrq,
    "ng_rec_dma": NgRecDma,
    "ng_dev_name": NgDevName,
    "ng_phys_range": NgPhysRange,
    "ng_user_map_key": NgUserMapKey,
    "ng_user_map_val": NgUserMapVal,
    "ng_hist_key": NgHistKey,
    "ng_hist_val": NgHistVal,
}
C_ENUMS: Final[dict[str, type[IntEnum]]] = {
    "ng_rec_type": NgRecType,
    "ng_config": NgConfig,
    "ng_dma_kind": NgDmaKind,
}

HDR_SIZE: Final = ctypes.sizeof(NgRecHdr)
MARK_TEXT_OFFSET: Final = NgRecMark.text.offset
_HDR: Final = struct.Struct("<QIHH")
_MARK_LEN: Final = struct.Struct("<I")


class BadRecord(ValueError):
    """A corrupt or truncated record (the caller counts and skips it)."""


_STRUCT_CODES: Final[dict[type, str]] = {
    ctypes.c_uint8: "B",
    ctypes.c_int8: "b",
    ctypes.c_uint16: "H",
    ctypes.c_int16: "h",
    ctypes.c_uint32: "I",
    ctypes.c_int32: "i",
    ctypes.c_uint64: "Q",
    ctypes.c_int64: "q",
}


def field(cls: type[ctypes.Structure], path: str) -> tuple[int, str]:
    """(offset, struct code) of a possibly dotted field name ("hdr.ts_ns")."""
    offset = 0
    ctype: type = cls
    for part in path.split("."):
        types = dict(ctype._fields_)  # type: ignore[attr-defined]
        if part not in types:
            raise KeyError(f"{ctype.__name__} has no field {part!r}")
        offset += getattr(ctype, part).offset
        ctype = types[part]
    if ctype in _STRUCT_CODES:
        return offset, _STRUCT_CODES[ctype]
    elem = getattr(ctype, "_type_", None)
    if issubclass(ctype, ctypes.Array) and elem in (ctypes.c_uint8, ctypes.c_char):
        return offset, f"{ctypes.sizeof(ctype)}s"
    raise TypeError(f"field {path!r} of {cls.__name__} is not a scalar or byte array")


def unpacker(
    cls: type[ctypes.Structure], fields: list[str | tuple[str, str]]
) -> struct.Struct:
    """A little-endian Struct of sizeof(cls) bytes yielding `fields`, given in
    ascending offset order as dotted names ("hdr.ts_ns"); a (name, code) pair
    reads a struct-module code at that field's offset instead (e.g. ("width",
    "I") reads the four u8 fields starting at width as one u32)."""
    fmt = ["<"]
    pos = 0
    for spec in fields:
        path, override = (spec, None) if isinstance(spec, str) else spec
        offset, code = field(cls, path)
        code = override or code
        if offset < pos:
            raise ValueError(f"field {path!r} overlaps or is out of offset order")
        if offset > pos:
            fmt.append(f"{offset - pos}x")
        fmt.append(code)
        pos = offset + struct.calcsize("<" + code)
    size = ctypes.sizeof(cls)
    if pos > size:
        raise ValueError(f"fields run past the end of {cls.__name__}")
    if size > pos:
        fmt.append(f"{size - pos}x")
    return struct.Struct("".join(fmt))


def parse(buf: bytes | bytearray | memoryview) -> Record:
    """Validate one raw record and return its ctypes mirror (a copy).

    Raises BadRecord if the record is shorter than its type needs, longer than
    its type plus PAD_SLACK, of an unknown type, has an op outside MMIOTNG_OP_*,
    or a mark length beyond NG_MARK_MAX or beyond the bytes present.
    A mark record may stop right after its text; the rest reads as zeros.
    """
    n = len(buf)
    if n < HDR_SIZE:
        raise BadRecord(f"truncated record: {n} bytes, the header alone is {HDR_SIZE}")
    _ts, _lost, rtype, _cpu = _HDR.unpack_from(buf)
    try:
        kind = NgRecType(rtype)
    except ValueError:
        raise BadRecord(f"unknown record type {rtype}") from None
    cls = RECORD_CLASSES[kind]
    size = ctypes.sizeof(cls)
    if n >= size + PAD_SLACK:
        raise BadRecord(f"{kind.name} record of {n} bytes, expected {size}")
    if kind is NgRecType.NG_REC_MARK:
        if n < MARK_TEXT_OFFSET:
            raise BadRecord(
                f"truncated NG_REC_MARK: {n} bytes, text starts at {MARK_TEXT_OFFSET}"
            )
        (text_len,) = _MARK_LEN.unpack_from(buf, NgRecMark.len.offset)
        if text_len > NG_MARK_MAX:
            raise BadRecord(
                f"NG_REC_MARK text length {text_len} > NG_MARK_MAX {NG_MARK_MAX}"
            )
        if n < MARK_TEXT_OFFSET + text_len:
            raise BadRecord(
                f"truncated NG_REC_MARK: {n} bytes, text needs {MARK_TEXT_OFFSET + text_len}"
            )
        if n < size:
            return NgRecMark.from_buffer_copy(bytes(buf) + bytes(size - n))
        return NgRecMark.from_buffer_copy(buf)
    if n < size:
        raise BadRecord(f"truncated {kind.name}: {n} bytes, expected {size}")
    rec = cls.from_buffer_copy(buf)
    if isinstance(rec, NgRecAccess):
        if rec.op not in VALID_OPS:
            raise BadRecord(f"NG_REC_ACCESS with op {rec.op}")
        if rec.compat_op not in VALID_OPS:
            raise BadRecord(f"NG_REC_ACCESS with compat_op {rec.compat_op}")
    return rec  # type: ignore[return-value]


def mark_text(rec: NgRecMark) -> bytes:
    """The `len` bytes of text a mark record carries (NULs included)."""
    return bytes(rec)[MARK_TEXT_OFFSET : MARK_TEXT_OFFSET + rec.len]


def record_sizes() -> dict[str, int]:
    """Each record type's size as this version lays it out (a recording's
    META keeps it, for readers to check they read the same layout)."""
    return {t.name: ctypes.sizeof(cls) for t, cls in RECORD_CLASSES.items()}
