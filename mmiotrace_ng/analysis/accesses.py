"""A trace as a stream of events with exact times and, where known, the CPU:
the input of export and plot.

A text trace (20070824) has no CPU column and microsecond times: its lines
are read through tracefile.parse_line.  A recorded file has both in every
record (ng_rec_hdr.cpu, ts_ns): its records are read directly, not through
the text, so nothing is lost on the way.  Either way the events come one at
a time, in file order, in constant memory.

Lost-events markers ("MARK 0.000000 Lost N events." in text, hdr.lost in a
record) are given the time of the record they stand before, not 0, so that
they land where the events went missing.

Register names (--regs MAP) come from a Namer: a function from a physical
address to a name or None; `register_namer` makes one from register maps.
"""

from __future__ import annotations

import ctypes
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

from ..common import ringbuf
from ..common.errors import UsageError
from ..format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_WRITE
from ..format.records import (
    BadRecord,
    NgRecAccess,
    NgRecDma,
    NgRecIrq,
    NgRecMap,
    NgRecMark,
    NgRecType,
    NgRecUnmap,
    NgRecUntraced,
    mark_text,
    parse,
    unpacker,
)
from ..format.render import ENCODING, ERRORS, irq_result, untraced_text
from .tracefile import Trace, TraceError, parse_line

NO_CPU: Final = -1              # text traces do not say
_LOST: Final = re.compile(r"Lost \d+ events\.")
_ACCESS_SIZE: Final = ctypes.sizeof(NgRecAccess)
_ACCESS_FIELDS: Final = unpacker(NgRecAccess, [
    "hdr.ts_ns", "hdr.lost", "hdr.type", "hdr.cpu", "phys", "value", "ip", "map_id", "pid",
    "width", "op", "insn"])
_OPS: Final = {MMIOTNG_OP_READ: "R", MMIOTNG_OP_WRITE: "W"}


class Event(NamedTuple):
    """One line's worth of a trace.  kind: R, W, UNKNOWN, MAP, UNMAP, MARK or
    PCIDEV (a header line, in text); with extras (recordings only), IRQ
    (map_id: the interrupt, width: 0 entry / 1 exit, value: the result,
    text: "DEV\tHANDLER") and DMA (phys: the bus address, length: the size,
    width: enum ng_dma_kind, value: the direction, text: the device,
    dma_phys: the memory's physical address, 0 where not known)."""

    kind: str
    ts_ns: int = 0
    cpu: int = NO_CPU
    map_id: int = 0
    phys: int = 0
    width: int = 0
    value: int = 0          # R/W: the value; MAP: the virtual address
    pc: int = 0
    pid: int = 0
    length: int = 0         # MAP: the length
    text: str = ""          # MARK: its text (no newline); UNKNOWN: "xx,xx,xx"; PCIDEV: the line
    dma_phys: int = 0       # DMA: the memory's physical address (0: not known)


def events(trace: Trace, extras: bool = False) -> Iterator[Event]:
    """The events of a trace, in file order (with extras, a recording's
    IRQ and DMA events too).  UsageError if it cannot be read."""
    try:
        if trace.recording is not None:
            yield from _recorded(trace, extras)
        else:
            yield from _text(trace)
    except (TraceError, OSError) as exc:
        raise UsageError(str(exc)) from exc


def valid_text(text: str) -> str:
    """Text read with surrogateescape as valid Unicode: each byte that is
    not UTF-8 becomes U+FFFD (for JSON, and for fonts)."""
    return text.encode(ENCODING, ERRORS).decode(ENCODING, "replace")


def open_trace(path: str) -> Trace:
    """Trace(path), its errors as UsageError."""
    try:
        return Trace(path)
    except (TraceError, ValueError) as exc:   # rawfile.NotRawFile is a ValueError
        raise UsageError(str(exc)) from exc


def _text(trace: Trace) -> Iterator[Event]:
    held: list[Event] = []          # Lost markers, until a record gives them a time
    last = 0
    for chunk in trace.chunks():
        for line in chunk:
            a = parse_line(line)
            kind = a.kind
            if kind == "?" or kind == "VERSION":
                continue
            if kind == "PCIDEV":
                yield Event(kind, text=a.text)
                continue
            ts = round(a.ts * 1_000_000) * 1000
            if kind == "MARK" and ts == 0 and _LOST.fullmatch(a.text):
                held.append(Event("MARK", text=a.text))
                continue
            last = ts
            if held:
                yield from (e._replace(ts_ns=ts) for e in held)
                held.clear()
            if kind == "MAP":
                yield Event(kind, ts, NO_CPU, a.map_id, a.phys, value=a.value, pc=a.pc,
                            pid=a.pid, length=a.length)
            elif kind == "MARK":
                yield Event(kind, ts, text=a.text)
            else:
                yield Event(kind, ts, NO_CPU, a.map_id, a.phys, a.width, a.value, a.pc,
                            a.pid, text=a.text)
    yield from (e._replace(ts_ns=last) for e in held)


def _recorded(trace: Trace, extras: bool = False) -> Iterator[Event]:
    rec = trace.recording
    assert rec is not None
    for line in rec.header.splitlines():
        if line.startswith("PCIDEV "):
            yield Event("PCIDEV", text=line)
    last = 0
    for view in rec.ring_chunks():
        pos = 0
        words = view.cast("I") if len(view) >= 4 else None
        while (nxt := ringbuf.next_record(view, pos, words)) is not None:
            pos, raw = nxt
            if raw is None:
                continue
            for ev in record_events(raw, extras):
                last = ev.ts_ns
                yield ev
    if rec.pending_lost:
        yield Event("MARK", last, text=f"Lost {rec.pending_lost} events.")


def record_events(raw: memoryview, extras: bool = False) -> list[Event]:
    """The events of one record: a Lost marker if it says events were
    dropped before it, then its own; none if it is corrupt.  An IRQ or DMA
    record has an event only with extras."""
    if len(raw) == _ACCESS_SIZE:
        (ts, lost, rtype, cpu, phys, value, ip, map_id, pid, width, op,
         insn) = _ACCESS_FIELDS.unpack(raw)
        if rtype == NgRecType.NG_REC_ACCESS:
            kind = _OPS.get(op, "UNKNOWN")
            ev = Event(kind, ts, cpu, map_id, phys, width, value, ip, pid,
                       text="" if kind != "UNKNOWN" else
                       f"{insn[0]:02x},{insn[1]:02x},{insn[2]:02x}")
            return [_lost(ts, cpu, lost), ev] if lost else [ev]
    try:
        r = parse(raw)
    except BadRecord:
        return []
    h = r.hdr
    lost = [_lost(h.ts_ns, h.cpu, h.lost)] if h.lost else []
    if isinstance(r, NgRecIrq):     # not events of the 20070824 text
        what = r.handler.decode(ENCODING, ERRORS) if not r.exit else irq_result(r.ret)
        text = r.dev.decode(ENCODING, ERRORS) + "\t" + what
        return lost + ([Event("IRQ", h.ts_ns, h.cpu, r.irq, width=r.exit, value=r.ret,
                              pid=r.pid, text=text)] if extras else [])
    if isinstance(r, NgRecDma):
        return lost + ([Event("DMA", h.ts_ns, h.cpu, phys=r.addr, width=r.kind, value=r.dir,
                              pid=r.pid, length=r.size, text=r.dev.decode(ENCODING, ERRORS),
                              dma_phys=r.phys)] if extras else [])
    if isinstance(r, NgRecAccess):     # an op parse accepts that the fast path did not
        ev = Event(_OPS.get(r.op, "UNKNOWN"), h.ts_ns, h.cpu, r.map_id, r.phys, r.width,
                   r.value, r.ip, r.pid, text=",".join(f"{b:02x}" for b in r.insn[:3]))
    elif isinstance(r, NgRecMap):
        ev = Event("MAP", h.ts_ns, h.cpu, r.map_id, r.phys, value=r.virt, pc=r.ip,
                   pid=r.pid, length=r.len)
    elif isinstance(r, NgRecUnmap):
        ev = Event("UNMAP", h.ts_ns, h.cpu, r.map_id, pc=r.ip, pid=r.pid)
    elif isinstance(r, NgRecUntraced):
        ev = Event("MARK", h.ts_ns, h.cpu, text=untraced_text(r))
    else:
        assert isinstance(r, NgRecMark)
        text = mark_text(r).split(b"\0", 1)[0].decode(ENCODING, ERRORS).removesuffix("\n")
        ev = Event("MARK", h.ts_ns, h.cpu, pid=r.pid, text=text)
    return [_lost(h.ts_ns, h.cpu, h.lost), ev] if h.lost else [ev]


def _lost(ts: int, cpu: int, n: int) -> Event:
    return Event("MARK", ts, cpu, text=f"Lost {n} events.")


Namer = Callable[[int], "str | None"]


class RegisterNames:
    """A Namer from register maps (regmap.py): the name of the register a
    physical address is in, where a map applies to the BAR it falls in.
    Which BARs those are the trace's PCIDEV lines say (its vendor:device
    and BAR addresses): feed them to pcidev() as they come, as annotate
    does."""

    def __init__(self, maps: list) -> None:     # list[regmap.RegMap]
        self.maps = maps
        self.regions: list[tuple[int, int, Any]] = []     # (start, end, map)
        self.applied: set[str] = set()
        self._names: dict[int, str | None] = {}

    def pcidev(self, line: str) -> None:
        from .annotate import parse_pcidev

        dev = parse_pcidev(line)
        if dev is None:
            return
        for r in dev.regions:
            for m in self.maps:
                if r.bar in m.bars_for(r.vendor, r.device):
                    self.regions.append((r.start, r.end, m))
                    self.applied.add(m.name)
                    self._names.clear()
                    break

    def __call__(self, phys: int) -> str | None:
        name = self._names.get(phys, "")
        if name != "":
            return name
        name = None
        for start, end, m in self.regions:
            if start <= phys < end:
                hit = m.lookup(phys - start)
                name = hit.name if hit is not None else None
                break
        if len(self._names) >= 1 << 16:
            self._names.clear()
        self._names[phys] = name
        return name


def register_namer(specs: list[str] | None) -> RegisterNames | None:
    """--regs MAP...: the maps named (a .regs file or a shipped map's name),
    or every shipped map if none is; None if there are none."""
    from . import regmap

    maps = [regmap.find(spec) for spec in specs] if specs else regmap.load_shipped()
    return RegisterNames(maps) if maps else None


def feed_pcidev(namer: Namer | None, line: str) -> None:
    """Give a PCIDEV line to a namer that takes them (RegisterNames)."""
    take = getattr(namer, "pcidev", None)
    if take is not None:
        take(line)


def note_unapplied(namer: RegisterNames | None, specs: list[str] | None, command: str) -> None:
    """On stderr: each map given by --regs that no device of the trace has."""
    if namer is None or not specs:
        return
    for m in namer.maps:
        if m.name not in namer.applied:
            ids = ", ".join(sorted({f"{t.vendor:04x}:{t.device:04x}" for t in m.targets}))
            print(f"mmiotrace-ng: {command}: {m.name} not applied: no device {ids} in the "
                  "trace", file=sys.stderr)
