"""Any trace as a stream of 20070824 text lines: the input of report, diff,
annotate, export and plot.

A trace is a text file in the 20070824 format (ours, or the kernel tracer's
trace_pipe saved), or a file that `record` (or `--raw`) wrote, which is
rendered on the way with the renderer the live tracer uses; "-" is standard
input, either kind (a recording there is copied to a temporary file first:
it is read more than once).  Opening one checks its start: a file that is
empty, or whose first line (after empty and # lines) is not a 20070824 line,
is not a trace (TraceError), so that no reader makes output of it.

Lines come in chunks (lists of str, each line with its "\\n"), so a trace
of any length is read in constant memory.

`Trace.symbols()` gives the traced machine's symbols where the file has
them (a recording's SYMS section), for callers as function+0xoff [module].
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, BinaryIO, Final, NamedTuple

from ..format.rawfile import MAGIC, RAW1_MAGIC, NotRawFile, Recording, open_recording
from ..format.render import ENCODING, ERRORS, Renderer, lost_line

TEXT_CHUNK: Final = 1 << 20     # bytes of text read at a time
RENDER_BATCH: Final = 16384     # records of a recording rendered at a time
HEAD_BLOCK: Final = 1 << 16     # bytes read at a time to check a trace's start
STDIN: Final = "-"
# the start of every line the tracers print before and among the records
RECORD_LINE: Final = re.compile(
    r"VERSION \S|PCIDEV [0-9a-f]{4} |(MAP|UNMAP|UNKNOWN|MARK) \d+\.\d{6} |"
    r"[RW] \d+ \d+\.\d{6} -?\d+ 0x")


class TraceError(Exception):
    """A trace cannot be read (the message says which and why)."""


def display_name(path: str) -> str:
    """How messages name the input path."""
    return "standard input" if path == STDIN else path


class Trace:
    """One trace to read; chunks() may be called once for "-", any number of
    times for a file.  TraceError if it cannot be read or is not a trace."""

    def __init__(self, path: str, name: str | None = None) -> None:
        """name: how messages call it (default: the path; "-": standard input)."""
        self.path = path
        self.name = display_name(path) if name is None else name
        self.recording: Recording | None = None
        self._head = b""                # standard input: what the check read of it
        self._spool: IO[bytes] | None = None    # standard input: a recording, copied
        try:
            if path == STDIN:
                self._open_stdin()
                return
            with open(path, "rb") as fh:
                head = _head(fh)
            if _is_recording(head):
                self.recording = open_recording(path, self.name)
            else:
                check_text(head, self.name)
        except OSError as exc:
            raise TraceError(f"cannot read {self.name}: {exc.strerror}") from exc
        except NotRawFile as exc:
            raise TraceError(str(exc)) from exc

    def _open_stdin(self) -> None:
        fh = sys.stdin.buffer
        head = _head(fh)
        if not _is_recording(head):
            check_text(head, self.name)
            self._head = head
            return
        spool = tempfile.TemporaryFile(prefix="mmiotrace-ng-")   # noqa: SIM115 (self's)
        spool.write(head)
        shutil.copyfileobj(fh, spool, TEXT_CHUNK)
        spool.flush()
        self._spool = spool     # nameless: opened again through /proc while it is open
        self.recording = open_recording(f"/proc/self/fd/{spool.fileno()}", self.name)

    @property
    def recorded(self) -> bool:
        return self.recording is not None

    def chunks(self, compat: bool = False, pc: bool = True, pid: bool = True,
               extras: bool = False) -> Iterator[list[str]]:
        """The trace's lines.  compat/pc/pid: how a recording is rendered,
        extras: with its interrupts and DMA mappings as MARK lines (text
        traces are given as they are)."""
        if self.recording is not None:
            yield from _rendered(self.recording, Renderer(compat, pc, pid, extras, extras))
        elif self.path == STDIN:
            head, self._head = self._head, b""
            yield from _text_chunks(_Prefixed(head, sys.stdin.buffer))
        else:
            try:
                with open(self.path, "rb") as fh:
                    yield from _text_chunks(fh)
            except OSError as exc:
                raise TraceError(f"cannot read {self.name}: {exc.strerror}") from exc

    def lines(self, **render: bool) -> Iterator[str]:
        for chunk in self.chunks(**render):
            yield from chunk

    def symbols(self):  # -> symbols.Kallsyms | None
        """The traced machine's symbols, if the file has them."""
        from ..common.symbols import Kallsyms, SymbolError

        if self.recording is None or not self.recording.kallsyms:
            return None
        try:
            return Kallsyms(self.recording.kallsyms)
        except SymbolError:
            return None


def _is_recording(head: bytes) -> bool:
    return head.startswith(MAGIC) or head.startswith(RAW1_MAGIC)


def _first_line(head: bytes) -> bytes | None:
    """The first whole line of head that is neither empty nor a # comment."""
    for line in head.split(b"\n")[:-1]:
        if line.strip() and not line.startswith(b"#"):
            return line
    return None


def _head(fh: BinaryIO) -> bytes:
    """The start of fh, up to its first line that is neither empty nor a
    comment (all of it if it has none), at most about TEXT_CHUNK bytes."""
    head = b""
    while len(head) < TEXT_CHUNK and _first_line(head) is None:
        block = fh.read(HEAD_BLOCK)
        if not block:
            break
        head += block
    return head


def check_text(head: bytes, name: str) -> None:
    """TraceError unless head (see _head) starts a 20070824 text trace."""
    line = _first_line(head)
    if line is None:
        line = head.rsplit(b"\n", 1)[-1]     # a last line without its newline
        if not line.strip() or line.startswith(b"#"):
            raise TraceError(f"{name} is empty: no trace in it")
    text = line.decode(ENCODING, ERRORS)
    if not RECORD_LINE.match(text):
        try:
            start = line[:40].decode("utf-8", "strict")
        except UnicodeDecodeError:
            start = ""
        seen = f"it starts {start!r}" if start and start.isprintable() else "binary data"
        raise TraceError(f"{name} is not a trace: neither mmiotrace text (20070824) nor a "
                         f"recording of mmiotrace-ng ({seen})")


class _Prefixed:
    """A binary stream's reads, after bytes read from it already."""

    def __init__(self, head: bytes, fh: BinaryIO) -> None:
        self.head = head
        self.fh = fh

    def read(self, n: int) -> bytes:
        if self.head:
            head, self.head = self.head, b""
            return head
        return self.fh.read(n)


def _text_chunks(fh: BinaryIO | _Prefixed) -> Iterator[list[str]]:
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
