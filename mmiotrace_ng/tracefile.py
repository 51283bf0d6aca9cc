"""Any trace as a stream of 20070824 text lines: the input of report, diff,
annotate, export and plot.

A trace is a text file in the 20070824 format (ours, or the kernel tracer's
trace_pipe saved), "-" for standard input, or a file that `record` (or
`--raw`) wrote, which is rendered on the way with the renderer the live
tracer uses.  Lines come in chunks (lists of str, each line with its "\\n"),
so a trace of any length is read in constant memory.

`Trace.symbols()` gives the traced machine's symbols where the file has
them (a recording's SYMS section), for callers as function+0xoff [module].
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import BinaryIO, Final, NamedTuple

from .rawfile import MAGIC, RAW1_MAGIC, NotRawFile, Recording, open_recording
from .render import ENCODING, ERRORS, Renderer, lost_line

TEXT_CHUNK: Final = 1 << 20     # bytes of text read at a time
RENDER_BATCH: Final = 16384     # records of a recording rendered at a time


class TraceError(Exception):
    """A trace cannot be read (the message says which and why)."""


class Trace:
    """One trace to read; chunks() may be called once for "-", any number of
    times for a file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.recording: Recording | None = None
        if path != "-":
            try:
                with open(path, "rb") as fh:
                    start = fh.read(len(MAGIC))
                if start == MAGIC or start.startswith(RAW1_MAGIC):
                    self.recording = open_recording(path)
            except OSError as exc:
                raise TraceError(f"cannot read {path}: {exc.strerror}") from exc
            except NotRawFile as exc:
                raise TraceError(str(exc)) from exc

    @property
    def recorded(self) -> bool:
        return self.recording is not None

    def chunks(self, compat: bool = False, pc: bool = True,
               pid: bool = True) -> Iterator[list[str]]:
        """The trace's lines.  compat/pc/pid: how a recording is rendered
        (text traces are given as they are)."""
        if self.recording is not None:
            yield from _rendered(self.recording, Renderer(compat, pc, pid))
        elif self.path == "-":
            yield from _text_chunks(sys.stdin.buffer)
        else:
            try:
                with open(self.path, "rb") as fh:
                    yield from _text_chunks(fh)
            except OSError as exc:
                raise TraceError(f"cannot read {self.path}: {exc.strerror}") from exc

    def lines(self, **render: bool) -> Iterator[str]:
        for chunk in self.chunks(**render):
            yield from chunk

    def symbols(self):  # -> symbols.Kallsyms | None
        """The traced machine's symbols, if the file has them."""
        from .symbols import Kallsyms, SymbolError

        if self.recording is None or not self.recording.kallsyms:
            return None
        try:
            return Kallsyms(self.recording.kallsyms)
        except SymbolError:
            return None


def _text_chunks(fh: BinaryIO) -> Iterator[list[str]]:
    rest = b""
    while block := fh.read(TEXT_CHUNK):
        block = rest + block
        cut = block.rfind(b"\n") + 1
        if not cut and len(block) >= TEXT_CHUNK:
            cut = len(block)        # no line is that long: not a trace, one line of junk
        rest = block[cut:]
        if cut:
            yield block[:cut].decode(ENCODING, ERRORS).splitlines(keepends=True)
    if rest:
        yield [rest.decode(ENCODING, ERRORS) + "\n"]


def rendered_text(rec: Recording, r: Renderer) -> Iterator[str]:
    """The text the live tracer printed with the same options (r), piece by
    piece: the header, the records, the last Lost line."""
    if rec.header:
        yield rec.header
    for view in rec.ring_chunks():
        pos = 0
        while pos < len(view):
            text, used = r.feed_ring(view[pos:], RENDER_BATCH)
            if not used:
                break
            pos += used
            if text:
                yield text
    if rec.pending_lost:
        yield lost_line(rec.pending_lost)


def _rendered(rec: Recording, r: Renderer) -> Iterator[list[str]]:
    for text in rendered_text(rec, r):
        yield text.splitlines(keepends=True)


class Access(NamedTuple):
    """One parsed line: kind is R, W, UNKNOWN, MAP, UNMAP, MARK (a Lost line
    is a MARK), PCIDEV, VERSION or "?" (anything else)."""

    kind: str
    ts: float = 0.0         # seconds
    map_id: int = 0
    phys: int = 0
    width: int = 0
    value: int = 0          # R/W value; MAP: virt
    pc: int = 0
    pid: int = 0
    length: int = 0         # MAP: the length
    text: str = ""          # MARK: the text; UNKNOWN: the bytes; other: the line


def parse_line(line: str) -> Access:
    """The fields of one 20070824 line (see ../shared format notes: R/W, MAP,
    UNMAP, UNKNOWN, MARK)."""
    f = line.split(" ")
    k = f[0]
    try:
        if k in ("R", "W") and len(f) >= 8:
            return Access(k, float(f[2]), int(f[3]), int(f[4], 16), int(f[1]),
                          int(f[5], 16), int(f[6], 16), int(f[7]))
        if k == "MAP" and len(f) >= 8:
            return Access(k, float(f[1]), int(f[2]), int(f[3], 16), 0, int(f[4], 16),
                          int(f[6], 16), int(f[7]), int(f[5], 16))
        if k == "UNMAP" and len(f) >= 5:
            return Access(k, float(f[1]), int(f[2]), pc=int(f[3], 16), pid=int(f[4]))
        if k == "UNKNOWN" and len(f) >= 7:
            return Access(k, float(f[1]), int(f[2]), int(f[3], 16), pc=int(f[5], 16),
                          pid=int(f[6]), text=f[4])
        if k == "MARK" and len(f) >= 2:
            return Access(k, float(f[1]), text=line.split(" ", 2)[2].rstrip("\n")
                          if len(f) > 2 else "")
    except ValueError:
        pass
    if k in ("PCIDEV", "VERSION"):
        return Access(k, text=line.rstrip("\n"))
    return Access("?", text=line.rstrip("\n"))
