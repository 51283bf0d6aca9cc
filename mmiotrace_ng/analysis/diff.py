"""`mmiotrace-ng diff A B`: compare two traces as their MMIO traffic.

What is compared.  Each line becomes a normalized record that keeps what
stays the same from one boot (or kernel) to the next and drops the rest:

    R/W      op, width, physical address, value      "R 4 0xfeb40008 0x80080783"
    UNKNOWN  physical address, instruction bytes     "UNKNOWN 0xfeb40008 f3,a5,00"
    MAP      physical address, length                "MAP 0xfeb40000 0x20000"
    UNMAP    the mapping its map id named (phys, length, as the MAP gave them;
             tracked per trace), or "(unknown mapping)"
    MARK     the text (our tracer's "ioremap ... is NOT traced" marks without
             their virtual address); the interrupts and DMA mappings of
             --irq/--dma (a recording's, or those MARK lines of a text
             trace) only with --irq/--dma, without the interrupt number and
             the bus address, and no section starts at them
    PCIDEV, VERSION   the line as it is (--ignore-header drops them)
    anything else     the line as it is; lines starting with "#" and empty
                      lines are skipped

Timestamps, virtual addresses, map ids, instruction addresses and pids never
count.  --ignore-value turns the value of accesses to the given offsets of
their mapping (offset = phys - the phys of the MAP line their map id names)
into "*".  A run of identical normalized records is one record with a count,
"R 4 0xfeb40008 0x80080783 (x1200)"; by default two runs are equal whatever
their counts (polling loops spin a different number of times on each boot),
--exact-counts makes the counts matter.

A "MARK 0.000000 Lost N events." line (and a corrupt record of a recording)
means records are missing: a comparison of that trace would not be
trustworthy, so it is an error (exit status 2, one line on stderr) unless
--allow-lost is given; then the Lost line is compared as a MARK and a warning
says how much was lost.

How.  Both traces are streamed: memory does not grow with their length.
Each input chunk is normalized with C-level operations: one re.findall over
the chunk for its R/W lines, a slow path per line only for the few others;
recordings are read from their binary records by columns, as the renderer's
fast path does, and only the records the column path declines (MAP, MARK,
lost events, UNKNOWN) go through the renderer.  Runs are folded with
map/compress over the chunk, and the two sequences of records are compared
in lockstep, list slice against list slice (about a million records of each
trace a second on one core: tests/bench/diff_bench.py).  At a mismatch the
next --window records of each side (default 4096) are searched for the
nearest resynchronization: the smallest da+db with A[i+da:i+da+3] ==
B[j+db:j+db+3] (both sides ending counts as a match); the skipped records
are the change, - for A's, + for B's (where they are few, difflib's matcher
finds the records they share, shown as context).  Failing that, a pure
insertion or deletion of up to 16 windows is looked for (A's next 3 records
in B's next 16 windows, and the other way round); failing that too, one
window of each side is shown as changed and the comparison goes on.

Output is a unified diff ("--- A", "+++ B", hunks with -U context lines, 3 by
default) whose line numbers count normalized records (a folded run is one),
not lines of the input files; the text after a hunk's "@@" is the mapping the
hunk's first changed access is in ("MAP 0xfeb40000 0x20000").  A hunk is cut
after MAX_HUNK_LINES lines, so that two traces that differ everywhere also
stay within bounded memory.

--by-marker reads both traces twice (standard input is first copied to a
temporary file): first their MARK lines, aligned (difflib, in order, by
text), then section by section: a section starts at a MARK line and runs to
the next; sections with the same MARK text are compared with each other, a
section only one trace has is shown as wholly removed or added.

Exit status: 0 the same, 1 different, 2 trouble (unreadable input, not a
trace, lost events, bad options).
"""

from __future__ import annotations

import argparse
import ctypes
import re
import struct
import sys
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, compress, count
from operator import ne, sub
from typing import BinaryIO, Final

from ..common.errors import UsageError
from ..common.helpformat import ExamplesFormatter
from ..format.render import ENCODING, ERRORS

WINDOW: Final = 4096        # records looked ahead on each side at a mismatch
SYNC: Final = 3             # records that must match again to resynchronize
FAR: Final = 16             # windows searched for a pure insertion/deletion
CONTEXT: Final = 3
MAX_HUNK_LINES: Final = 65536
REFINE_LIMIT: Final = 1 << 16  # da * db up to which a change is refined (difflib)
BLOCK: Final = 16384        # records of a recording normalized at a time

Key = tuple[str, str]       # (kind, rest): "R 4", "0xfeb40008 0x80080783"

EPILOG = """\
compared: R/W by op, width, physical address and value; UNKNOWN by address and
instruction bytes; MAP by physical address and length; UNMAP by the mapping its
map id named; MARK by text; PCIDEV/VERSION and other lines as they are.
Ignored: timestamps, virtual addresses, map ids, pc, pid, empty lines and lines starting "#".

Runs of one repeated record are folded into one line, "R 4 0xfeb40008
0x80080783 (x1200)", and compare equal whatever their counts unless
--exact-counts is given.  Hunk line numbers count these folded records, not
lines of the files.  The text after "@@" is the mapping of the hunk's first
changed access.

Both inputs are streamed (constant memory).  At a mismatch the next --window
records of each side are searched for the closest point where 3 records match
again; failing that, an insertion or deletion of up to 16 windows; failing
that, one window of each side is shown as changed and the comparison goes on.

A trace that lost events ("MARK 0.000000 Lost N events.") is an error (exit
status 2) unless --allow-lost.  Exit status: 0 the same, 1 different, 2 trouble.

examples:
  mmiotrace-ng diff boot1.txt boot2.txt
  mmiotrace-ng diff --ignore-value 0x2800,0x2804 -U 5 old.raw new.txt
  mmiotrace-ng diff --by-marker --ignore-header a.txt b.txt
  ssh guest cat trace.txt | mmiotrace-ng diff -q reference.txt -
"""


def _offsets(text: str) -> set[int]:
    try:
        found = {int(word, 0) for word in text.split(",") if word.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not offsets: {text!r} (give e.g. 0x2800,0x2804)") from None
    if not found or min(found) < 0:
        raise argparse.ArgumentTypeError(f"not offsets: {text!r}")
    return found


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
    return n


def _nonnegative(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"not a number >= 0: {text!r}")
    return n


def setup(ap: argparse.ArgumentParser) -> None:
    ap.formatter_class = ExamplesFormatter
    ap.epilog = EPILOG
    ap.add_argument("a", metavar="A", help="a trace: text (20070824), a recorded file, "
                                           "or - for standard input")
    ap.add_argument("b", metavar="B", help="the other trace (at most one of them -)")
    ap.add_argument("-U", "--unified", type=_nonnegative, default=CONTEXT, metavar="N",
                    help=f"records of context around each change (default {CONTEXT})")
    ap.add_argument("--exact-counts", action="store_true",
                    help="runs of a repeated record differ if their counts do (by "
                         "default a polling loop that spun longer is the same)")
    ap.add_argument("--ignore-value", type=_offsets, action="append", default=[],
                    metavar="OFFSET[,OFFSET...]",
                    help="ignore the values of accesses to these offsets within their "
                         "mapping (from its MAP line), e.g. 0x2800 (repeatable)")
    ap.add_argument("--by-marker", action="store_true",
                    help="compare section by section, a section starting at each MARK "
                         "line: sections with the same MARK text (in order) with each "
                         "other, others as wholly removed or added")
    ap.add_argument("--ignore-header", action="store_true",
                    help="skip VERSION and PCIDEV lines (devices, BAR addresses)")
    ap.add_argument("--allow-lost", action="store_true",
                    help="compare traces that lost events (a warning, not an error)")
    ap.add_argument("--irq", action="store_true",
                    help="compare the traced devices' interrupts too (a recording's, or the "
                         "MARK lines of --irq), without their numbers, which differ between "
                         "boots; left out by default")
    ap.add_argument("--dma", action="store_true",
                    help="compare their DMA mappings too (kind, device, size, direction: "
                         "not the bus address); left out by default")
    ap.add_argument("--compat", action="store_true",
                    help="read recorded inputs as the kernel's decoder would "
                         "(UNKNOWN lines), to compare them with the kernel tracer's text")
    ap.add_argument("--window", type=_positive, default=WINDOW, metavar="N",
                    help=f"records looked ahead on each side to resynchronize after a "
                         f"change (default {WINDOW})")
    ap.add_argument("-q", "--brief", action="store_true",
                    help="say only whether the traces differ")


# --- normalizing a trace -----------------------------------------------------

# R and W lines, the bulk: "R 4 70.316725 1 0xfeb40008 0x80080783 0x0 0\n" ->
# ("R 4", "0xfeb40008 0x80080783"); "*" is an ignored value (see _Normalizer._fast).
# [^ ]++ is the fastest field (a field may take a newline: then a match takes
# two lines, which _fast's count of matches against lines catches).
_RW: Final = re.compile(r"([RW] \d+) [^ ]++ [^ ]++ (0x[^ ]++ [^ ]++) .++\n")
# the start of each line that is not an R/W line, in "\n" + text
_SLOW: Final = re.compile(r"\n(?![RW] )")
_STAR: Final = re.compile(r"\*[0-9a-f]+")
_LOST: Final = re.compile(r"Lost (\d+) events\.")
# the MARK lines of --irq and --dma (format/render.py: irq_text, dma_text)
_IRQ_MARK: Final = re.compile(r"irq \d+ (\S+ (?:enter|exit) \S+)")
_DMA_MARK: Final = re.compile(r"dma (\S+ \S+) 0x[0-9a-f]+ (\d+ \S+)")
_UNTRACED_AT: Final = re.compile(r"^(mmiotrace-ng: ioremap of 0x[0-9a-f]+ size 0x[0-9a-f]+)"
                                 r" at 0x[0-9a-f]+( is NOT traced)")
_NOTHING: Final = object()


class _Lost(Exception):
    """A trace lost events (message: how many)."""


@dataclass
class _Raw:
    """Normalized records of a piece of trace before runs are folded, and
    where its MAP lines and section-starting MARK lines are (by index)."""

    keys: list[Key] = field(default_factory=list)
    maps: list[tuple[int, int, int]] = field(default_factory=list)   # (index, phys, len)
    marks: list[tuple[int, str]] = field(default_factory=list)       # (index, text)


def _extra_mark(f: list[str], line: str) -> re.Match[str] | None:
    """The match of a MARK line of --irq or --dma (f: its fields), or None."""
    if len(f) < 3 or f[2] not in ("irq", "dma"):
        return None
    return (_IRQ_MARK if f[2] == "irq" else _DMA_MARK).fullmatch(line.split(" ", 2)[2])


class _Normalizer:
    """Turns 20070824 text into normalized records, for one trace: it keeps
    what later lines need of earlier ones (the mappings by map id)."""

    def __init__(self, name: str, offsets: set[int], ignore_header: bool,
                 allow_lost: bool, irq: bool = False, dma: bool = False) -> None:
        self.name = name
        self.offsets = offsets
        self.ignore_header = ignore_header
        self.allow_lost = allow_lost
        self.irq = irq
        self.dma = dma
        self.maps: dict[str, tuple[int, int]] = {}           # map id -> (phys, len)
        self._ignored: dict[str, list[tuple[str, str]]] = {}  # map id -> replacements
        self._replace: list[tuple[str, str]] = []
        self.lost = 0

    def text(self, text: str, out: _Raw) -> None:
        """Append the records of text (whole lines) to out."""
        pos = 0
        end = len(text)
        for m in _SLOW.finditer("\n" + text):
            start = m.start()       # where the line starts in text
            if start >= end:
                break
            if start > pos:
                self._fast(text[pos:start], out)
            nl = text.find("\n", start)
            pos = nl + 1 if nl >= 0 else end
            self._slow(text[start:pos].rstrip("\n"), out)
        if pos < end:
            self._fast(text[pos:], out)

    def _fast(self, text: str, out: _Raw) -> None:
        """R/W lines only."""
        if self._replace:
            # " 1 0xfeb42800 0x..." -> " 1 0xfeb42800 *...", then "*..." -> "*"
            for old, new in self._replace:
                if old in text:
                    text = text.replace(old, new)
            if "*" in text:
                text = _STAR.sub("*", text)
        keys = _RW.findall(text)
        if len(keys) == text.count("\n"):
            out.keys += keys
        else:       # some line is not as the tracers print them
            for line in text.splitlines():
                self._slow(line, out)

    def _slow(self, line: str, out: _Raw) -> None:
        """Any one line (without its newline)."""
        if not line or line.startswith("#"):
            return
        f = line.split(" ")
        kind = f[0]
        key: Key
        try:
            if kind in ("R", "W") and len(f) >= 6:
                # (an ignored value is "*" already: _fast replaced it)
                key = (f"{kind} {f[1]}", f"{f[4]} {f[5]}")
            elif kind == "UNKNOWN" and len(f) >= 5:
                key = (kind, f"{f[3]} {f[4]}")
            elif kind == "MAP" and len(f) >= 6:
                phys, length = int(f[3], 16), int(f[5], 16)
                self._map(f[2], phys, length)
                out.maps.append((len(out.keys), phys, length))
                key = (kind, f"0x{phys:x} 0x{length:x}")
            elif kind == "UNMAP" and len(f) >= 3:
                known = self._unmap(f[2])
                key = (kind, f"0x{known[0]:x} 0x{known[1]:x}" if known
                       else "(unknown mapping)")
            elif kind == "MARK" and (m := _extra_mark(f, line)) is not None:
                # an interrupt or a DMA mapping: no section starts there
                if not (self.irq if f[2] == "irq" else self.dma):
                    return
                key = (kind, f"{f[2]} " + " ".join(m.groups()))
            elif kind == "MARK" and len(f) >= 2:
                text = line.split(" ", 2)[2] if len(f) > 2 else ""
                lost = _LOST.fullmatch(text) if f[1] == "0.000000" else None
                if lost:
                    self._lost(int(lost[1]))
                else:
                    text = _UNTRACED_AT.sub(r"\1\2", text)
                    out.marks.append((len(out.keys), text))
                key = (kind, text)
            elif kind in ("PCIDEV", "VERSION"):
                if self.ignore_header:
                    return
                key = (kind, line[len(kind) + 1:])
            else:
                key = ("", line)
        except ValueError:
            key = ("", line)
        out.keys.append(key)

    def _map(self, map_id: str, phys: int, length: int) -> None:
        self.maps[map_id] = (phys, length)
        if self.offsets:
            self._ignored[map_id] = [
                (f" {map_id} 0x{phys + off:x} 0x", f" {map_id} 0x{phys + off:x} *")
                for off in sorted(self.offsets) if off < length]
            self._replace = list(chain.from_iterable(self._ignored.values()))

    def _unmap(self, map_id: str) -> tuple[int, int] | None:
        known = self.maps.pop(map_id, None)
        if self._ignored.pop(map_id, None) is not None:
            self._replace = list(chain.from_iterable(self._ignored.values()))
        return known

    def _lost(self, n: int) -> None:
        self.lost += n
        if not self.allow_lost:
            raise _Lost(f"{self.name}: the trace lost {self.lost} events, so a comparison "
                        "of it is not trustworthy (--allow-lost compares anyway)")


# --- reading recordings by columns -------------------------------------------


class _Columns:
    """Normalized records straight from runs of access records in ring
    memory (no text rendered): the fields are read as strided columns, and
    one `%` formats a run.  Anything unusual in a run (another record type,
    lost events, an UNKNOWN op) makes it decline the run: the caller then
    renders it and normalizes the text."""

    def __init__(self, compat: bool) -> None:
        from ..common import ringbuf
        from ..format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_WRITE
        from ..format.records import NgRecAccess, NgRecType
        from ..format.records import field as rec_field
        from ..format.render import access_column as column

        self.size = ctypes.sizeof(NgRecAccess)
        self.stride = ringbuf.stride(self.size)
        self.access = int(NgRecType.NG_REC_ACCESS)

        width, op = ("compat_width", "compat_op") if compat else ("width", "op")
        if rec_field(NgRecAccess, op)[0] != rec_field(NgRecAccess, width)[0] + 1:
            raise ImportError(f"ng_rec_access.{width} and .{op} are not adjacent")
        self.type = column("hdr.type")
        self.lost = column("hdr.lost")
        self.ops = column(width, "H")           # width | op << 8
        self.phys = column("phys")
        self.value = column("compat_value" if compat else "value")
        self.names = {w | o << 8: f"{letter} {w}" for w in range(256)
                      for o, letter in ((MMIOTNG_OP_READ, "R"), (MMIOTNG_OP_WRITE, "W"))}

    def keys(self, run: memoryview, n: int) -> list[Key] | None:
        views = {code: run.cast(code) for code in "HIQ"}

        def col(spec: tuple[str, int]) -> list[int]:
            code, first = spec
            return views[code][first::self.stride // struct.calcsize(code)].tolist()

        ops = col(self.ops)
        if (col(self.type).count(self.access) != n or col(self.lost).count(0) != n
                or not self.names.keys() >= set(ops)):
            return None
        args: list[int] = [0] * (2 * n)
        args[0::2] = col(self.phys)
        args[1::2] = col(self.value)
        rest = ("0x%x 0x%x\n" * n % tuple(args)).split("\n")
        rest.pop()
        return list(zip(map(self.names.__getitem__, ops), rest, strict=True))


def _recorded(trace, norm: _Normalizer, compat: bool, columns: bool, irq: bool = False,
              dma: bool = False) -> Iterator[_Raw]:
    """The records of a recording, BLOCK at a time: runs of access records by
    columns (unless columns is False: --ignore-value needs map ids), the rest
    rendered and normalized as text, in order."""
    from ..common import ringbuf
    from ..format.render import Renderer, lost_line

    rec = trace.recording
    renderer = Renderer(compat, False, False, irq, dma)
    cols = _Columns(compat)
    out = _Raw()
    if rec.header:
        norm.text(rec.header, out)
    text: list[str] = []
    for view in rec.ring_chunks():
        pos, end = 0, len(view)
        while pos < end:
            n = ringbuf.run_of(view[pos:], cols.size, min(BLOCK, (end - pos) // cols.stride))
            if n:
                run = view[pos:pos + n * cols.stride]
                keys = cols.keys(run, n) if columns else None
                if keys is None:
                    text.append(renderer.feed_ring(run)[0])
                else:
                    if text:
                        norm.text("".join(text), out)
                        text = []
                    out.keys += keys
                pos += n * cols.stride
            else:
                got = ringbuf.next_record(view, pos)
                if got is None:
                    break
                pos, raw = got
                if raw is not None:
                    text.append(renderer.feed(raw))
                    renderer.untraced.clear()   # (for the tracer's stderr)
            if renderer.bad:
                norm.lost += renderer.bad
                if not norm.allow_lost:
                    raise _Lost(f"{norm.name}: {renderer.bad} records of the recording are "
                                "corrupt, so a comparison of it is not trustworthy "
                                "(--allow-lost compares anyway)")
                renderer.bad = 0
            if len(out.keys) + len(text) >= BLOCK:
                if text:
                    norm.text("".join(text), out)
                    text = []
                yield out
                out = _Raw()
    if rec.pending_lost:
        text.append(lost_line(rec.pending_lost))
    if text:
        norm.text("".join(text), out)
    yield out


@dataclass
class _Block:
    """Folded records: keys[i] repeated counts[i] times; where MAP lines and
    section starts are (by index)."""

    keys: list[Key]
    counts: list[int]
    maps: list[tuple[int, int, int]]
    marks: list[tuple[int, str]]


def _fold(raw: _Raw) -> _Block:
    """Runs of equal records folded, with map/compress (no Python code per record)."""
    keys = raw.keys
    flags = list(map(ne, keys, chain((_NOTHING,), keys)))
    starts = list(compress(count(), flags))
    ends = starts[1:]
    ends.append(len(keys))

    def where(i: int) -> int:
        return bisect_right(starts, i) - 1

    marks: list[tuple[int, str]] = []
    for i, text in raw.marks:
        j = where(i)
        if not marks or marks[-1][0] != j:
            marks.append((j, text))
    return _Block(list(compress(keys, flags)), list(map(sub, ends, starts)),
                  [(where(i), p, n) for i, p, n in raw.maps], marks)


class _Source:
    """One trace as a stream of _Blocks, runs folded across block boundaries
    too (a block's last run is held back until the next block starts)."""

    def __init__(self, path: str, name: str, args: argparse.Namespace) -> None:
        from .tracefile import Trace, TraceError, display_name

        self.name = name
        try:
            self.trace = Trace(path, display_name(name))
        except TraceError as exc:
            raise UsageError(str(exc)) from exc
        self.args = args
        self.norm = self._normalizer()

    def _normalizer(self) -> _Normalizer:
        args = self.args
        return _Normalizer(self.name, set().union(*args.ignore_value), args.ignore_header,
                           args.allow_lost, args.irq, args.dma)

    def _raws(self, norm: _Normalizer) -> Iterator[_Raw]:
        if self.trace.recorded:
            yield from _recorded(self.trace, norm, self.args.compat,
                                 columns=not norm.offsets, irq=self.args.irq,
                                 dma=self.args.dma)
            return
        for chunk in self.trace.chunks():
            out = _Raw()
            norm.text("".join(chunk), out)
            yield out

    def blocks(self) -> Iterator[_Block]:
        """One pass over the trace (each call starts again, from scratch)."""
        from .tracefile import TraceError

        self.norm = norm = self._normalizer()
        held: _Block | None = None
        try:
            for raw in self._raws(norm):
                if not raw.keys:
                    continue
                block = _fold(raw)
                if held is not None:
                    _prepend(block, held)
                held = _Block([block.keys.pop()], [block.counts.pop()], [], [])
                last = len(block.keys)
                held.maps = [(0, p, n) for i, p, n in block.maps if i == last]
                held.marks = [(0, t) for i, t in block.marks if i == last]
                block.maps = [m for m in block.maps if m[0] < last]
                block.marks = [m for m in block.marks if m[0] < last]
                if block.keys:
                    yield block
        except TraceError as exc:
            raise UsageError(str(exc)) from exc
        except _Lost as exc:
            raise UsageError(str(exc)) from exc
        if held is not None:
            yield held

    def markers(self) -> list[str]:
        """The texts of the MARK lines that start sections, in order."""
        return [t for b in self.blocks() for _, t in b.marks]


def _prepend(block: _Block, held: _Block) -> None:
    """Put the held-back last run of the previous block in front of block,
    as one run with block's first if they are the same record."""
    if block.keys[0] == held.keys[0]:
        block.counts[0] += held.counts[0]
        shift = 0
    else:
        block.keys.insert(0, held.keys[0])
        block.counts.insert(0, held.counts[0])
        shift = 1
    block.maps = held.maps + [(i + shift, p, n) for i, p, n in block.maps]
    marks = [(i + shift, t) for i, t in block.marks]
    if held.marks and marks and marks[0][0] == 0:
        marks.pop(0)
    block.marks = held.marks + marks


# --- the two sides -------------------------------------------------------------


class _Side:
    """A trace being compared: a window of its folded records (keys, counts,
    and cmp, what is compared: the keys, or (key, count) with
    --exact-counts), the position reached, and its sections."""

    def __init__(self, source: _Source, exact: bool, by_marker: bool) -> None:
        self.name = source.name
        self.source = source
        self._blocks = source.blocks()
        self.exact = exact
        self.by_marker = by_marker
        self.keys: list[Key] = []
        self.counts: list[int] = []
        self.cmp: list = [] if exact else self.keys
        self.pos = 0            # index in keys of the next record to compare
        self.base = 0           # record number of keys[0]
        self.eof = False
        self._maps: deque[tuple[int, int, int]] = deque()   # (record number, phys, len)
        self.mappings: dict[tuple[int, int], int] = {}      # (phys, len) -> its last MAP
        self.bounds: deque[int] = deque()  # record numbers of section starts ahead

    @property
    def seq(self) -> int:
        return self.base + self.pos

    def load(self) -> bool:
        """One more block (False at the end of the trace)."""
        block = next(self._blocks, None)
        if block is None:
            self.eof = True
            return False
        self._pass_maps(self.seq)
        if self.pos:
            del self.keys[:self.pos]
            del self.counts[:self.pos]
            if self.exact:
                del self.cmp[:self.pos]
            self.base += self.pos
            self.pos = 0
        at = self.base + len(self.keys)
        self.keys += block.keys
        self.counts += block.counts
        if self.exact:
            self.cmp += zip(block.keys, block.counts, strict=True)
        self._maps.extend((at + i, p, n) for i, p, n in block.maps)
        if self.by_marker:
            self.bounds.extend(at + i for i, _ in block.marks)
        return True

    def _end(self) -> int:
        """Index in keys where the current section ends, as far as loaded."""
        if self.bounds and self.bounds[0] - self.base < len(self.keys):
            return self.bounds[0] - self.base
        return len(self.keys)

    def _end_known(self) -> bool:
        return self.eof or bool(self.bounds and self.bounds[0] - self.base < len(self.keys))

    def avail(self) -> int:
        """Records loaded from the position to the end of the section."""
        return self._end() - self.pos

    def done(self) -> bool:
        return self._end_known() and self.pos == self._end()

    def fill(self, need: int) -> None:
        while self.avail() < need and not self._end_known():
            self.load()

    def closed(self) -> bool:
        """Whether everything to the end of the section is loaded."""
        return self._end_known()

    def next_section(self) -> None:
        """The section starting at the position (a MARK record) is current."""
        while self.bounds and self.bounds[0] <= self.seq:
            self.bounds.popleft()

    def same(self, other: _Side, n: int) -> int:
        """How many of the next n records of both sides are equal: slices
        compared in C, short ones first (the cost follows the answer, not n,
        where changes are dense)."""
        done, step = 0, 64
        while done < n:
            k = min(step, n - done)
            a = self.cmp[self.pos + done:self.pos + done + k]
            b = other.cmp[other.pos + done:other.pos + done + k]
            if a != b:
                return done + next(compress(count(), map(ne, a, b)))
            done += k
            step *= 8
        return n

    def _pass_maps(self, seq: int) -> None:
        while self._maps and self._maps[0][0] < seq:
            s, p, n = self._maps.popleft()
            self.mappings[(p, n)] = s

    def context(self, seq: int, key: Key) -> str:
        """The MAP line of the mapping the access key (record number seq) is
        in, or "" (not an access, or no mapping known)."""
        if key[0][:2] not in ("R ", "W ") and key[0] != "UNKNOWN":
            return ""
        try:
            phys = int(key[1].split(" ", 1)[0], 16)
        except ValueError:
            return ""
        self._pass_maps(seq)
        found = [(s, p, n) for (p, n), s in self.mappings.items() if p <= phys < p + n]
        if not found:
            return ""
        _, p, n = max(found)
        return f"MAP 0x{p:x} 0x{n:x}"


def _gram(cmp: list, at: int) -> tuple:
    return tuple(cmp[at:at + SYNC])


def _resync(a: _Side, b: _Side, window: int) -> tuple[int, int]:
    """How many records of a and b to show as changed at a mismatch: the
    smallest da+db after which SYNC records (or both section ends) match,
    within window records of each side; then a pure insertion or deletion of
    up to FAR windows; else a window of each."""
    a.fill(window + SYNC)
    b.fill(window + SYNC)
    la, lb = a.avail(), b.avail()
    # a position d may start a match if SYNC records follow it, or fewer
    # because the section ends there (then only the other side's end matches)
    last_a = min(window - 1, la if a.closed() else la - SYNC)
    last_b = min(window - 1, lb if b.closed() else lb - SYNC)
    seen_a: dict[tuple, int] = {}
    seen_b: dict[tuple, int] = {}
    best: tuple[int, int] | None = None
    for d in range(max(last_a, last_b) + 1):
        if d <= last_a:
            g = _gram(a.cmp, a.pos + d)
            seen_a.setdefault(g, d)
            if g in seen_b and (best is None or d + seen_b[g] < sum(best)):
                best = (d, seen_b[g])
        if d <= last_b:
            g = _gram(b.cmp, b.pos + d)
            seen_b.setdefault(g, d)
            if g in seen_a and (best is None or seen_a[g] + d < sum(best)):
                best = (seen_a[g], d)
        # a pair not seen yet has a member > d, so it cannot beat best <= d + 1
        if best is not None and sum(best) <= d + 1:
            break
    if best is not None:
        return best
    found = [far for far in (_far(a, b, window), _far(b, a, window)[::-1]) if far]
    if found:
        return min(found, key=sum)
    return min(window, la), min(window, lb)


def _far(a: _Side, b: _Side, window: int) -> tuple[int, int] | tuple[()]:
    """(0, db): a's next SYNC records start db records on in b (a pure
    insertion in b), db <= FAR windows; () if not found."""
    b.fill(FAR * window + SYNC)
    a.fill(SYNC)
    gram = a.cmp[a.pos:a.pos + min(SYNC, a.avail())]    # shorter: a's section ends
    lo, hi = b.pos, b.pos + min(b.avail(), FAR * window)
    if not gram:
        return (0, b.avail()) if b.closed() and b.avail() <= FAR * window else ()
    j = lo
    while True:
        try:
            j = b.cmp.index(gram[0], j, hi)
        except ValueError:
            return ()
        if b.cmp[j:j + len(gram)] == gram and (
                len(gram) == SYNC or (b.closed() and j + len(gram) == b._end())):
            return (0, j - b.pos)
        j += 1


# --- unified output ----------------------------------------------------------


class _Differ(Exception):
    """-q: the first difference ends the comparison."""


def _show(key: Key, n: int) -> str:
    text = f"{key[0]} {key[1]}" if key[0] else key[1]
    return f"{text} (x{n})" if n > 1 else text


def _span(start: int, n: int) -> str:
    """GNU diff's way: "l,n", "l" for one line, "l-1,0" for none."""
    if n == 1:
        return str(start)
    return f"{start - 1 if n == 0 else start},{n}"


class _Hunks:
    """Builds and writes the hunks: equal() and change() in trace order."""

    def __init__(self, out: BinaryIO, names: tuple[str, str], context: int,
                 brief: bool) -> None:
        self.out = out
        self.names = names
        self.context = context
        self.brief = brief
        self.pre: deque[tuple[Key, int, int, int, int]] = deque(maxlen=context)
        self.trail: list[tuple[Key, int, int, int, int]] = []
        self.lines: list[str] = []
        self.open = False
        self.start_a = self.start_b = self.na = self.nb = 0
        self.where = ""
        self.written = 0

    @staticmethod
    def _items(a: _Side, b: _Side, i: int, j: int) -> list[tuple[Key, int, int, int, int]]:
        return [(a.keys[a.pos + k], a.counts[a.pos + k], b.counts[b.pos + k],
                 a.seq + k, b.seq + k) for k in range(i, j)]

    def equal(self, a: _Side, b: _Side, m: int) -> None:
        """The next m records of a and b are equal (not yet passed)."""
        take = 0
        if self.open:
            take = min(m, 2 * self.context + 1 - len(self.trail))
            self.trail += self._items(a, b, 0, take)
            if len(self.trail) <= 2 * self.context:
                return
            before = self.trail[len(self.trail) - self.context:]
            self._close()
            self.pre.extend(before)
        if self.context:
            self.pre.extend(self._items(a, b, max(take, m - self.context), m))

    def _context_line(self, item: tuple[Key, int, int, int, int]) -> str:
        key, ca, cb = item[:3]
        if ca == cb:
            return " " + _show(key, ca) + "\n"
        return f" {_show(key, 1)} (x{ca} vs x{cb})\n"

    def change(self, a: _Side, da: int, b: _Side, db: int) -> None:
        """The next da records of a are replaced by the next db of b."""
        if self.brief:
            raise _Differ
        if self.open:
            self.lines += map(self._context_line, self.trail)
            self.na += len(self.trail)
            self.nb += len(self.trail)
            self.trail = []
        else:
            self.open = True
            self.start_a, self.start_b = a.seq - len(self.pre), b.seq - len(self.pre)
            self.lines = list(map(self._context_line, self.pre))
            self.na = self.nb = len(self.pre)
            self.where = ""
        self.pre.clear()
        removed = zip(a.keys[a.pos:a.pos + da], a.counts[a.pos:a.pos + da], strict=True)
        added = zip(b.keys[b.pos:b.pos + db], b.counts[b.pos:b.pos + db], strict=True)
        self.lines += ["-" + _show(k, n) + "\n" for k, n in removed]
        self.lines += ["+" + _show(k, n) + "\n" for k, n in added]
        if not self.where:
            self.where = (next(filter(None, (a.context(a.seq + i, a.keys[a.pos + i])
                                             for i in range(da))), "")
                          or next(filter(None, (b.context(b.seq + i, b.keys[b.pos + i])
                                                for i in range(db))), ""))
        self.na += da
        self.nb += db
        if len(self.lines) >= MAX_HUNK_LINES:
            self._close()

    def _close(self) -> None:
        tail = self.trail[:self.context]
        self.lines += map(self._context_line, tail)
        self.na += len(tail)
        self.nb += len(tail)
        head = f"@@ -{_span(self.start_a + 1, self.na)} +{_span(self.start_b + 1, self.nb)} @@"
        if self.where:
            head += " " + self.where
        text = head + "\n" + "".join(self.lines)
        if not self.written:
            text = f"--- {self.names[0]}\n+++ {self.names[1]}\n" + text
        self.out.write(text.encode(ENCODING, ERRORS))
        self.written += 1
        self.open = False
        self.trail = []
        self.lines = []

    def finish(self) -> None:
        if self.open:
            self._close()


# --- comparing -----------------------------------------------------------------


def _compare(a: _Side, b: _Side, hunks: _Hunks, window: int) -> None:
    """The current sections of a and b, to their ends."""
    while True:
        na, nb = a.avail(), b.avail()
        if not na and not a.done():
            a.load()
            continue
        if not nb and not b.done():
            b.load()
            continue
        n = min(na, nb)
        if n:
            m = a.same(b, n)
            if m:
                hunks.equal(a, b, m)
                a.pos += m
                b.pos += m
            if m == n:
                continue
        elif a.done() and b.done():
            return
        _changed(a, b, *_resync(a, b, window), hunks)


def _changed(a: _Side, b: _Side, da: int, db: int, hunks: _Hunks) -> None:
    """Show the next da records of a and db of b as changed, finer where it
    is cheap: the records they share (in order, difflib's matching) as
    context between the changes."""
    if not da or not db or da * db > REFINE_LIMIT:
        hunks.change(a, da, b, db)
        a.pos += da
        b.pos += db
        return
    from difflib import SequenceMatcher

    matcher = SequenceMatcher(None, a.cmp[a.pos:a.pos + da], b.cmp[b.pos:b.pos + db],
                              autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            hunks.equal(a, b, i2 - i1)
        else:
            hunks.change(a, i2 - i1, b, j2 - j1)
        a.pos += i2 - i1
        b.pos += j2 - j1


def _drain(side: _Side, other: _Side, hunks: _Hunks, window: int, removed: bool) -> None:
    """The current section of side, shown as wholly removed (side is A) or added."""
    while True:
        side.fill(window)
        n = side.avail()
        if not n:
            if side.done():
                return
            continue
        if removed:
            hunks.change(side, n, other, 0)
        else:
            hunks.change(other, 0, side, n)
        side.pos += n


def _plan(a: list[str], b: list[str]) -> list[tuple[int | None, int | None]]:
    """Sections paired (index in a, index in b; None: only in the other);
    section 0 is what comes before the first MARK line."""
    from difflib import SequenceMatcher

    plan: list[tuple[int | None, int | None]] = [(0, 0)]
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            plan += [(i + 1, j + 1) for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
        else:
            plan += [(i + 1, None) for i in range(i1, i2)]
            plan += [(None, j + 1) for j in range(j1, j2)]
    return plan


def _by_marker(a: _Side, b: _Side, hunks: _Hunks, window: int) -> None:
    plan = _plan(a.source.markers(), b.source.markers())
    for k, (ia, ib) in enumerate(plan):
        if k:
            if ia is not None:
                a.next_section()
            if ib is not None:
                b.next_section()
        if ia is not None and ib is not None:
            _compare(a, b, hunks, window)
        elif ia is not None:
            _drain(a, b, hunks, window, removed=True)
        else:
            _drain(b, a, hunks, window, removed=False)


def _spool_stdin() -> str:
    """Standard input copied to a temporary file (--by-marker reads it twice)."""
    import shutil
    import tempfile

    tmp = tempfile.NamedTemporaryFile(prefix="mmiotrace-ng-diff-", delete=False)  # noqa: SIM115
    with tmp:
        shutil.copyfileobj(sys.stdin.buffer, tmp, 1 << 20)
    return tmp.name


def diff(args: argparse.Namespace, out: BinaryIO) -> int:
    """Compare args.a and args.b, writing the hunks to out: 0 same, 1 different.

    The cyclic garbage collector is off meanwhile: the records are millions
    of short-lived tuples it would scan again and again (15% of the time),
    and nothing here makes reference cycles."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        return _diff(args, out)
    finally:
        if collecting:
            gc.enable()


def _diff(args: argparse.Namespace, out: BinaryIO) -> int:
    import os

    if args.a == "-" and args.b == "-":
        raise UsageError("only one of the traces can be standard input")
    paths, spooled = [args.a, args.b], None
    if args.by_marker and "-" in paths:
        spooled = _spool_stdin()
        paths[paths.index("-")] = spooled
    try:
        sides = [_Side(_Source(path, name, args), args.exact_counts, args.by_marker)
                 for path, name in zip(paths, (args.a, args.b), strict=True)]
        hunks = _Hunks(out, (args.a, args.b), args.unified, args.brief)
        try:
            if args.by_marker:
                _by_marker(*sides, hunks, args.window)
            else:
                _compare(*sides, hunks, args.window)
        except _Differ:
            out.write(f"Traces {args.a} and {args.b} differ\n".encode(ENCODING, ERRORS))
            return 1
        hunks.finish()
    finally:
        if spooled:
            os.unlink(spooled)
    for side in sides:
        if side.source.norm.lost:
            print(f"mmiotrace-ng: warning: {side.name} lost {side.source.norm.lost} "
                  "events; compared anyway (--allow-lost)", file=sys.stderr)
    return 1 if hunks.written else 0


def run(args: argparse.Namespace) -> int:
    from ..common.output import writing

    with writing(None) as out:
        return diff(args, out)
