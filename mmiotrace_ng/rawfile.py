"""The --raw file: a trace's binary records, to be rendered later (mmiotrace-ng render).

Layout, all integers little-endian:

    "mmiotrace-ng raw 1\\n"       the magic line (RAW_MAGIC), 19 bytes
    u32 length, bytes            the stream header: the text before the first
                                 record (VERSION and PCIDEV lines), UTF-8 with
                                 surrogateescape (render.ENCODING/ERRORS)
    u32 length, bytes            one record, as the BPF ring buffer held it
    ...                          (a struct ng_rec_* of bpf/mmiotrace_ng.h, see
                                 records.parse), in the order they came

The records are the ring buffer's payloads only: discarded ones are left
out, and the ring's own 8-byte headers and padding are not stored.  The
tracer writes (and flushes) the records a batch at a time as it prints them:
a run that is killed leaves every batch flushed before, perhaps part of the
next; a frame cut short at the end comes back shorter than its length says,
which the renderer counts as a corrupt record.  A file with the magic line and
no frame (the tracer stopped before its header) has an empty header and no
records.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Final

from .render import ENCODING, ERRORS

RAW_MAGIC: Final = b"mmiotrace-ng raw 1\n"
_LENGTH: Final = struct.Struct("<I")


class NotRawFile(ValueError):
    """The file does not start with RAW_MAGIC."""


class RawWriter:
    """Writes a --raw file: header() once, then records() batch by batch."""

    def __init__(self, path: str) -> None:
        self.fh = open(path, "wb")
        self.fh.write(RAW_MAGIC)

    def header(self, text: str) -> None:
        data = text.encode(ENCODING, ERRORS)
        self.fh.write(_LENGTH.pack(len(data)) + data)

    def records(self, recs: list[bytes]) -> None:
        self.fh.write(b"".join(_LENGTH.pack(len(r)) + r for r in recs))
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def read_raw(path: str) -> tuple[str, list[bytes]]:
    """The header text and the records of a --raw file."""
    data = Path(path).read_bytes()
    if not data.startswith(RAW_MAGIC):
        raise NotRawFile(f"{path} is not an mmiotrace-ng --raw file")
    pos = len(RAW_MAGIC)
    out = []
    while pos + _LENGTH.size <= len(data):
        (n,) = _LENGTH.unpack_from(data, pos)
        pos += _LENGTH.size
        out.append(data[pos:pos + n])
        pos += n
    if not out:
        return "", []
    return out[0].decode(ENCODING, ERRORS), out[1:]
