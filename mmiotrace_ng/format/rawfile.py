"""Recorded traces: the binary records of a run, rendered later (record, report).

Format 2 (what `record` and `--raw` write), all integers little-endian:

    "mmiotrace-ng record 2\\n"     the magic line (MAGIC)
    sections, each: 4-byte tag, u32 length, that many bytes

    META  JSON: format, tool version, kernel release, host, boot id, start
          time, the command line, the ring's record layout (record size per
          type)
    HEAD  the stream header: the text before the first record (VERSION and
          PCIDEV lines), UTF-8 with surrogateescape (render.ENCODING/ERRORS)
    RSUM  the checksums of the RING section that follows it: u32 block size
          B, then the zlib CRC-32 of each B bytes of it (the last block may
          be shorter)
    RING  bytes copied from the BPF ring buffer as they were: records with
          their 8-byte ring headers, 8-byte aligned, discarded ones included
          (see ringbuf), never a record still being written; a section ends
          on a record's end
    END   JSON at the end of a run: lost (events dropped in all), pending
          (dropped after the last record that said so: the final Lost line)
    SYMS  /proc/kallsyms at the end of the run, zlib-compressed
    MODS  /proc/modules at the end of the run

Sections come in this order, RSUM and RING repeated once per drain.  Readers
skip tags they do not know.  A run that is killed leaves every section
flushed before; a section cut short at the end is dropped whole except for
RING, of which the whole records in its blocks that match their checksums are
kept.  The checksums are what makes that safe: a write interrupted by the
kill may leave other bytes than the ones written in the file's last blocks
(a network file system's server may read the pages after the writer died),
and records made of those would be made up.  A RING without RSUM (files of
earlier versions) is taken as it is.

Format 1 (`--raw` of earlier versions) is still read: the magic line
"mmiotrace-ng raw 1\\n", then u32-length frames, the first the header text,
each other one record's payload.
"""

from __future__ import annotations

import ctypes
import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Final

from ..common import ringbuf
from .records import NgRecAccess
from .render import ENCODING, ERRORS

ACCESS_SIZE: Final = ctypes.sizeof(NgRecAccess)

MAGIC: Final = b"mmiotrace-ng record 2\n"
RAW1_MAGIC: Final = b"mmiotrace-ng raw 1\n"
_SECTION: Final = struct.Struct("<4sI")
_LENGTH: Final = struct.Struct("<I")
RING_CHUNK: Final = 1 << 22     # a RING section's largest size when reading v1 files
SUM_BLOCK: Final = 1 << 16      # bytes per checksum: what a kill may cost beyond
                                # the bytes it kept from being written


class NotRawFile(ValueError):
    """The file is not a recorded trace."""


class RawWriter:
    """Writes a recorded trace: meta() and header() once, ring() per drain,
    end() at the end; every call leaves the file flushed."""

    def __init__(self, path: str | int) -> None:
        self.fh: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.fh.write(MAGIC)

    def _section(self, tag: bytes, data: bytes | memoryview) -> None:
        self.fh.write(_SECTION.pack(tag, len(data)))
        self.fh.write(data)

    def meta(self, info: dict) -> None:
        self._section(b"META", json.dumps(info, sort_keys=True).encode())

    def header(self, text: str) -> None:
        self._section(b"HEAD", text.encode(ENCODING, ERRORS))
        self.fh.flush()

    def ring(self, view: memoryview) -> None:
        """Ring-buffer bytes: whole records, committed or discarded."""
        if view:
            self._section(b"RSUM", checksums(view))
            self._section(b"RING", view)
            self.fh.flush()

    def records(self, recs: list[bytes]) -> None:
        """Record payloads (as records.parse takes them)."""
        self.ring(memoryview(ringbuf.pack(recs)))

    def end(self, lost: int, pending: int, kallsyms: str | None,
            modules: str | None) -> None:
        self._section(b"END ", json.dumps({"lost": lost, "pending": pending}).encode())
        if kallsyms is not None:
            self._section(b"SYMS", zlib.compress(kallsyms.encode(ENCODING, ERRORS), 1))
        if modules is not None:
            self._section(b"MODS", modules.encode(ENCODING, ERRORS))
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


@dataclass
class Recording:
    """What a recorded file holds, except its RING sections (read those with
    ring_chunks, which streams them)."""

    path: str
    format: int
    meta: dict = field(default_factory=dict)
    header: str = ""
    end: dict | None = None            # None: the run did not end (killed)
    kallsyms: str | None = None
    modules: str | None = None
    unverified: int = 0                # bytes of RING data left out: checksums not met
    # (offset, length, checksums or None)
    _rings: list[tuple[int, int, bytes | None]] = field(default_factory=list)

    def ring_chunks(self) -> Iterator[memoryview]:
        """The RING sections' bytes in order, one section at a time (the
        whole records in them that pass their checksums: the bytes that do
        not are counted in unverified)."""
        self.unverified = 0
        if self.format == 1:
            yield from _v1_rings(self.path)
            return
        with open(self.path, "rb") as fh:
            for off, n, sums in self._rings:
                fh.seek(off)
                data = memoryview(fh.read(n))
                if sums is not None:
                    good = verified(data, n, sums)
                    self.unverified += len(data) - good
                    data = data[:good]
                yield data[: _whole_records(data)]

    @property
    def pending_lost(self) -> int:
        return int(self.end["pending"]) if self.end else 0


def checksums(view: memoryview) -> bytes:
    """The RSUM section of a RING section's bytes."""
    sums = [zlib.crc32(view[i : i + SUM_BLOCK]) for i in range(0, len(view), SUM_BLOCK)]
    return struct.pack(f"<I{len(sums)}I", SUM_BLOCK, *sums)


def verified(data: memoryview, length: int, sums: bytes) -> int:
    """How many bytes at the start of data (a RING section of length bytes,
    maybe cut short) are in blocks that are whole and match their checksums."""
    (block,) = _LENGTH.unpack_from(sums)
    want = struct.unpack_from(f"<{len(sums) // 4 - 1}I", sums, 4)
    if block <= 0 or len(want) != -(-length // block):
        return 0
    good = 0
    for i, crc in enumerate(want):
        chunk = data[i * block : (i + 1) * block]
        if len(chunk) < min(block, length - i * block) or zlib.crc32(chunk) != crc:
            break
        good += len(chunk)
    return good


def _whole_records(view: memoryview) -> int:
    """Bytes of the whole records at the start of view (a section cut short
    by a kill may end inside one)."""
    return ringbuf.committed(view, ACCESS_SIZE)[0]


def _read_exact(fh: BinaryIO, n: int) -> bytes | None:
    data = fh.read(n)
    return data if len(data) == n else None


def open_recording(path: str, name: str | None = None) -> Recording:
    """The sections of a recorded file (RING ones by position only); name:
    how messages call it (default: path)."""
    name = path if name is None else name
    with open(path, "rb") as fh:
        magic = fh.read(len(MAGIC))
        if magic.startswith(RAW1_MAGIC):
            return _open_v1(path)
        if magic != MAGIC:
            raise NotRawFile(f"{name} is not a trace recorded by mmiotrace-ng")
        rec = Recording(path, 2)
        sums: bytes | None = None       # the RSUM before the next RING
        while (head := _read_exact(fh, _SECTION.size)) is not None:
            tag, n = _SECTION.unpack(head)
            if tag == b"RING":
                rec._rings.append((fh.tell(), n, sums))
                sums = None
                fh.seek(n, 1)
                continue
            data = _read_exact(fh, n)
            if data is None:
                break
            if tag == b"RSUM":
                if n < 4 or n % 4:
                    raise NotRawFile(f"{name}: its RSUM section is damaged")
                sums = data
                continue
            try:
                _section(rec, tag, data)
            except (ValueError, zlib.error) as exc:
                raise NotRawFile(f"{name}: its {tag.decode(errors='replace').strip()} "
                                 f"section is damaged ({exc})") from exc
    return rec


def _section(rec: Recording, tag: bytes, data: bytes) -> None:
    if tag == b"META":
        rec.meta = json.loads(data)
    elif tag == b"HEAD":
        rec.header = data.decode(ENCODING, ERRORS)
    elif tag == b"END ":
        rec.end = json.loads(data)
    elif tag == b"SYMS":
        rec.kallsyms = zlib.decompress(data).decode(ENCODING, ERRORS)
    elif tag == b"MODS":
        rec.modules = data.decode(ENCODING, ERRORS)


def _v1_frames(path: str) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        fh.seek(len(RAW1_MAGIC))
        while (head := _read_exact(fh, _LENGTH.size)) is not None:
            (n,) = _LENGTH.unpack(head)
            yield fh.read(n)


def _open_v1(path: str) -> Recording:
    rec = Recording(path, 1)
    for data in _v1_frames(path):
        rec.header = data.decode(ENCODING, ERRORS)
        break
    return rec


def _v1_rings(path: str) -> Iterator[memoryview]:
    frames = _v1_frames(path)
    next(frames, None)      # the header
    batch: list[bytes] = []
    size = 0
    for data in frames:
        batch.append(data)
        size += len(data) + ringbuf.HEADER
        if size >= RING_CHUNK:
            yield memoryview(ringbuf.pack(batch))
            batch, size = [], 0
    if batch:
        yield memoryview(ringbuf.pack(batch))


def read_raw(path: str) -> tuple[str, list[bytes]]:
    """The header text and every record payload of a recorded file (all in
    memory: for tests and small files)."""
    rec = open_recording(path)
    out: list[bytes] = []
    for chunk in rec.ring_chunks():
        out += ringbuf.payloads(chunk)[0]
    return rec.header, out
