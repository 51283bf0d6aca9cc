"""mmiotrace-ng annotate FILE: a trace as people read it.

Each access becomes one line: its time and the time since the line before,
the mapping (#id), R/W and width, the register's name and decoded fields
from a register map (regmap.py) where one applies, else the offset in the
BAR (or in the mapping), the value, and the caller as function+0xoff
[module] when the trace has instruction addresses.  MAP, UNMAP and MARK
lines say what they are about, a Lost line stands out, a traced device's
interrupts and DMA mappings (a recording's, or the MARK lines of --irq and
--dma) are lines of their own (a handler's exit with how long it ran), a
value read or written that is the bus address of a DMA mapping says so,
and polling is folded:
a run of identical accesses (same op, width, address, value and caller) is
one line with its count and duration, and so is a short cycle repeated (a
write then a read, again and again: its first round, then the count).

A map applies to the BAR of a device its `device` lines name, found by the
trace's PCIDEV lines (vendor:device, BAR addresses), so that an access is
named only if it falls inside that BAR.  Without --regs every shipped map is
tried; stderr says which apply to what.  The times are the trace's own; the
time since the line before counts from the end of a folded line.  Memory
stays constant: a few accesses are held back while a repetition may start.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Final

from ..format.render import DMA_TEXT_RE, IRQ_TEXT_RE

if TYPE_CHECKING:
    from ..common.symbols import Kallsyms
    from .regmap import RegMap
    from .tracefile import Access

DEFAULT_FOLD: Final = 4
MIN_CYCLE_ROUNDS: Final = 3      # a cycle of 2+ accesses is folded from 3 rounds on
PLACE_WIDTH: Final = 10          # the register column is padded to this
CACHE_LIMIT: Final = 1 << 16     # texts of distinct accesses kept for reuse
_LOST_RE: Final = re.compile(r"Lost (\d+) events\.")
_SIZE_RE: Final = re.compile(r"/0x[0-9a-f]+(?= |$)")
DMA_KEPT: Final = 4096           # DMA mappings remembered at most (the oldest go)
US_PER_S: Final = 1_000_000


def setup(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("file", metavar="FILE",
                    help="a trace: text (20070824) or recorded; - for standard input")
    ap.add_argument("--regs", action="append", default=[], metavar="MAP",
                    help="register map: a .regs file or the name of a shipped one (e1000, "
                         "edu); repeatable; default: every shipped map, each where its "
                         "device is in the trace")
    ap.add_argument("--kallsyms", metavar="FILE",
                    help="a saved /proc/kallsyms of the traced machine, for the callers of "
                         "a text trace (a recorded file has its own)")
    ap.add_argument("--fold", type=int, default=DEFAULT_FOLD, metavar="N",
                    help=f"fold repeated cycles of up to N accesses (default {DEFAULT_FOLD}; "
                         "1: runs of one access only; 0: no folding)")
    ap.add_argument("-o", "--output", metavar="OUT", help="write here, not stdout")


# --- what the trace's header says: devices and their BARs ----------------------


@dataclass
class Region:
    """A memory BAR (or ROM, bar 6) of a PCI device, from a PCIDEV line."""

    bdf: str
    vendor: int
    device: int
    bar: int
    start: int
    size: int
    regmap: RegMap | None = None

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def bar_name(self) -> str:
        return "ROM" if self.bar == 6 else f"BAR{self.bar}"

    def __str__(self) -> str:
        return f"{self.bdf} {self.vendor:04x}:{self.device:04x} {self.bar_name}"


@dataclass
class Device:
    bdf: str
    vendor: int
    device: int
    driver: str
    regions: list[Region]
    io: list[tuple[int, int, int]]     # (bar, port, size)


def parse_pcidev(line: str) -> Device | None:
    """The device a PCIDEV line describes (see the format: bus/devfn,
    vendor+device, irq, 7 starts with flags, 7 sizes, driver), None if the
    line is not one."""
    f = line.rstrip("\n").split(" ")
    if len(f) < 18 or f[0] != "PCIDEV":
        return None
    try:
        busdevfn, ids = int(f[1], 16), int(f[2], 16)
        starts = [int(x, 16) for x in f[4:11]]
        sizes = [int(x, 16) for x in f[11:18]]
    except ValueError:
        return None
    bus, devfn = busdevfn >> 8, busdevfn & 0xFF
    bdf = f"{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"
    vendor, device = ids >> 16, ids & 0xFFFF
    regions: list[Region] = []
    io: list[tuple[int, int, int]] = []
    for bar, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        if not size:
            continue
        if bar < 6 and start & 1:           # I/O space: no MMIO
            io.append((bar, start & ~0x3, size))
        else:
            regions.append(Region(bdf, vendor, device, bar, start & ~0xF, size))
    return Device(bdf, vendor, device, " ".join(f[18:]).strip(), regions, io)


@dataclass
class Mapping:
    map_id: int
    phys: int
    length: int
    region: Region | None


# --- folding -------------------------------------------------------------------


class Event:
    """An access waiting to be printed: key is what makes two the same."""

    __slots__ = ("key", "ts", "a")

    def __init__(self, a: Access, ts: int) -> None:
        self.key = (a.kind, a.width, a.map_id, a.phys, a.value, a.pc, a.text)
        self.ts = ts
        self.a = a


class Folder:
    """Finds repetitions in a stream of events, holding back a few of them
    (2*longest, or 3 rounds of a cycle): a run of one event repeated (run()),
    a cycle of 2 to `longest` events repeated MIN_CYCLE_ROUNDS times or more
    (cycle()); every other event goes to one(), in order."""

    def __init__(self, longest: int, one: Callable[[Event], None],
                 run: Callable[[Event, int, int], None],
                 cycle: Callable[[list[Event], int, int], None]) -> None:
        self.longest = longest
        self.one, self.run, self.cycle = one, run, cycle
        self.held: list[Event] = []          # no repetition among them yet
        self.pattern: list[Event] = []       # the repeating cycle's first round
        self.rounds = 0
        self.last_ts = 0                     # the end of the last whole round
        self.partial: list[Event] = []       # the next round so far
        self.early: list[Event] = []         # a cycle's whole rounds while too few

    def push(self, ev: Event) -> None:
        if self.pattern:
            if ev.key == self.pattern[len(self.partial)].key:
                self.partial.append(ev)
                if len(self.partial) == len(self.pattern):
                    self.rounds += 1
                    self.last_ts = ev.ts
                    if self.rounds < MIN_CYCLE_ROUNDS:
                        self.early += self.partial
                    else:
                        self.early = []
                    self.partial = []
                return
            rest = [*self.partial, ev]
            self._end_cycle()
            for e in rest:
                self.push(e)
            return
        held = self.held
        held.append(ev)
        n = len(held)
        for p in range(1, self.longest + 1):
            if n < 2 * p:
                break
            if all(held[n - 2 * p + i].key == held[n - p + i].key for i in range(p)):
                for e in held[: n - 2 * p]:
                    self.one(e)
                self.pattern = held[n - 2 * p: n - p]
                self.rounds = 2
                self.last_ts = held[-1].ts
                self.partial = []
                self.early = held[n - 2 * p:] if p > 1 and MIN_CYCLE_ROUNDS > 2 else []
                self.held = []
                return
        if n > 2 * self.longest:
            self.one(held.pop(0))

    def _end_cycle(self) -> None:
        if len(self.pattern) == 1:
            self.run(self.pattern[0], self.rounds, self.last_ts)
        elif self.rounds < MIN_CYCLE_ROUNDS:
            for e in self.early:        # too short to be worth a fold
                self.one(e)
        else:
            self.cycle(self.pattern, self.rounds, self.last_ts)
        self.pattern = []
        self.partial = []
        self.early = []

    def flush(self) -> None:
        """Print everything held (before a line that is not an access, and
        at the end)."""
        while self.pattern:
            rest = self.partial
            self._end_cycle()
            for e in rest:
                self.push(e)
        for e in self.held:
            self.one(e)
        self.held = []


# --- text ----------------------------------------------------------------------


def seconds(us: int) -> str:
    return f"{us // US_PER_S}.{us % US_PER_S:06d}"


def delta(us: int) -> str:
    return ("-" if us < 0 else "+") + seconds(abs(us))


def span(us: int) -> str:
    """A duration for people: 412 us, 3.1 ms, 2.25 s."""
    if us < 1000:
        return f"{us} us"
    if us < US_PER_S:
        return f"{us / 1000:.1f} ms"
    return f"{us / US_PER_S:.2f} s"


def to_us(ts: float) -> int:
    return round(ts * US_PER_S)


class Annotator:
    """Turns 20070824 lines into the annotated listing: feed() each line,
    finish() at the end, take() what is ready to print."""

    def __init__(self, maps: list[RegMap], symbols: Kallsyms | None = None,
                 fold: int = DEFAULT_FOLD, note: Callable[[str], None] | None = None) -> None:
        self.maps = maps
        self.symbols = symbols
        self.note = note or (lambda _msg: None)
        self.out: list[str] = []
        self.applied: dict[str, list[str]] = {}      # map name -> what it names
        self.folder = Folder(fold, self._one, self._run, self._cycle) if fold > 0 else None
        self._callers: dict[int, str] = {}
        self._reset()
        self.started = False

    def _reset(self) -> None:
        self.devices: dict[str, Device] = {}
        self.regions: list[Region] = []
        self.mappings: dict[int, Mapping] = {}
        self.prev: int | None = None
        self._texts: dict[tuple, str] = {}
        self.irq_entries: dict[int, int] = {}       # irq -> its handler's entry (us)
        # bus address -> (end, what, when): the DMA mappings live now
        self.dma: dict[int, tuple[int, str, int]] = {}

    # -- input

    def feed(self, line: str) -> None:
        from .tracefile import parse_line

        a = parse_line(line)
        kind = a.kind
        if kind in ("R", "W", "UNKNOWN"):
            self.started = True
            ev = Event(a, to_us(a.ts))
            if self.folder is not None:
                self.folder.push(ev)
            else:
                self._one(ev)
            return
        if self.folder is not None:
            self.folder.flush()
        self._texts.clear()
        if kind == "MAP":
            self._map(a)
        elif kind == "UNMAP":
            self._unmap(a)
        elif kind == "MARK":
            self._mark(a)
        elif kind == "PCIDEV":
            self._pcidev(line)
        elif kind == "VERSION":
            if self.started:
                self._reset()
                self.out.append(f"# --- a new trace starts here ({a.text}) ---\n")
        elif a.text.startswith("#"):
            self.out.append(a.text + "\n")      # a comment, as the reference traces have
        elif a.text.strip():
            self.started = True
            self.out.append(f"?? {a.text}\n")

    def finish(self) -> None:
        if self.folder is not None:
            self.folder.flush()

    def take(self) -> list[str]:
        out, self.out = self.out, []
        return out

    # -- the header

    def _pcidev(self, line: str) -> None:
        dev = parse_pcidev(line)
        if dev is None:
            self.out.append(f"?? {line.rstrip()}\n")
            return
        self.started = True
        old = self.devices.pop(dev.bdf, None)
        if old is not None:
            self.regions = [r for r in self.regions if r.bdf != dev.bdf]
        self.devices[dev.bdf] = dev
        for r in dev.regions:
            r.regmap = self._map_for(r)
            self.regions.append(r)
        for m in self.mappings.values():
            m.region = self._region_at(m.phys)
        if not dev.regions:
            return
        parts = []
        for r in dev.regions:
            text = f"{r.bar_name} 0x{r.start:x}+0x{r.size:x}"
            parts.append(text + (f" [{r.regmap.name}]" if r.regmap else ""))
        parts += [f"BAR{bar} io 0x{port:x}+0x{size:x}" for bar, port, size in dev.io]
        driver = f" ({dev.driver})" if dev.driver else ""
        self.out.append(f"# PCI {dev.bdf} {dev.vendor:04x}:{dev.device:04x}{driver}: "
                        + ", ".join(parts) + "\n")

    def _map_for(self, r: Region) -> RegMap | None:
        found = [m for m in self.maps if r.bar in m.bars_for(r.vendor, r.device)]
        if not found:
            return None
        self.note(f"annotate: {found[0].name} names the registers of {r}")
        for other in found[1:]:
            self.note(f"annotate: {other.name} fits {r} too; {found[0].name} is used")
        self.applied.setdefault(found[0].name, []).append(str(r))
        return found[0]

    def _region_at(self, phys: int) -> Region | None:
        for r in self.regions:
            if r.start <= phys < r.end:
                return r
        return None

    def _region_of(self, map_id: int, phys: int) -> Region | None:
        m = self.mappings.get(map_id)
        if m is not None and m.region is not None and m.region.start <= phys < m.region.end:
            return m.region
        return self._region_at(phys)

    # -- lines

    def _prefix(self, ts: int) -> str:
        d = 0 if self.prev is None else ts - self.prev
        return f"{seconds(ts):>11} {delta(d):>10} "

    def _caller(self, pc: int) -> str:
        if self.symbols is None:
            return f"0x{pc:x}"
        text = self._callers.get(pc)
        if text is None:
            text = _SIZE_RE.sub("", self.symbols.function(pc), count=1)
            if len(self._callers) >= CACHE_LIMIT:
                self._callers.clear()
            self._callers[pc] = text
        return text

    def _body(self, a: Access) -> str:
        """#id, op, width, register (or offset), value and fields."""
        key = (a.kind, a.width, a.map_id, a.phys, a.value, a.text)
        text = self._texts.get(key)
        if text is not None:
            return text
        region = self._region_of(a.map_id, a.phys)
        place = fields = ""
        if region is not None:
            off = a.phys - region.start
            if region.regmap is not None:
                if a.kind == "UNKNOWN":
                    hit = region.regmap.lookup(off)
                    place = hit.name if hit else ""
                else:
                    got = region.regmap.describe(off, a.width, a.value)
                    if got is not None:
                        place, fields = got
            place = place or f"+0x{off:04x}"
        else:
            m = self.mappings.get(a.map_id)
            if m is not None and m.phys <= a.phys < m.phys + m.length:
                place = f"+0x{a.phys - m.phys:04x}"
            else:
                place = f"0x{a.phys:x}"
        if a.kind == "UNKNOWN":
            text = f"#{a.map_id} UNKNOWN {place} insn {a.text}"
        else:
            text = f"#{a.map_id} {a.kind} {a.width} {place:<{PLACE_WIDTH}} 0x{a.value:x}"
            if fields:
                text += f" {fields}"
        if len(self._texts) >= CACHE_LIMIT:
            self._texts.clear()
        self._texts[key] = text
        return text

    def _tail(self, a: Access) -> str:
        dma = self._dma_at(a.value, to_us(a.ts)) if self.dma and a.kind in ("R", "W") else ""
        return (f"  {self._caller(a.pc)}" if a.pc else "") + dma + "\n"

    def _dma_at(self, value: int, now: int) -> str:
        """"  = DMA ..." if value is inside a live DMA mapping's bus range."""
        for start, (end, what, when) in self.dma.items():
            if start <= value < end:
                off = f"+0x{value - start:x} of " if value != start else ""
                return f"  = {off}DMA {what} mapped {span(now - when)} before"
        return ""

    def _one(self, ev: Event) -> None:
        self.out.append(self._prefix(ev.ts) + self._body(ev.a) + self._tail(ev.a))
        self.prev = ev.ts

    def _run(self, ev: Event, count: int, last: int) -> None:
        self.out.append(self._prefix(ev.ts) + self._body(ev.a)
                        + f" (x{count}, {span(last - ev.ts)})" + self._tail(ev.a))
        self.prev = last

    def _cycle(self, events: list[Event], count: int, last: int) -> None:
        width = 0
        for ev in events:
            prefix = self._prefix(ev.ts)
            width = len(prefix)
            self.out.append(prefix + "| " + self._body(ev.a) + self._tail(ev.a))
            self.prev = ev.ts
        self.out.append(" " * width + f"'-- these {len(events)} accesses x{count} "
                        f"({span(last - events[0].ts)})\n")
        self.prev = last

    def _line(self, ts: int, text: str) -> None:
        self.out.append(self._prefix(ts) + text)
        self.prev = ts

    def _map(self, a: Access) -> None:
        self.started = True
        region = self._region_at(a.phys)
        self.mappings[a.map_id] = Mapping(a.map_id, a.phys, a.length, region)
        text = f"#{a.map_id} MAP 0x{a.phys:x} len 0x{a.length:x}"
        if region is not None:
            off = a.phys - region.start
            text += f"  {region}" + (f"+0x{off:x}" if off else "")
            dev = self.devices.get(region.bdf)
            if dev is not None and dev.driver:
                text += f" ({dev.driver})"
            if region.regmap is not None:
                text += f"  regs {region.regmap.name}"
        self._line(to_us(a.ts), text + self._tail(a))

    def _unmap(self, a: Access) -> None:
        m = self.mappings.get(a.map_id)
        what = ""
        if m is not None:
            what = f"  0x{m.phys:x} len 0x{m.length:x}" + (f"  {m.region}" if m.region else "")
        self._line(to_us(a.ts), f"#{a.map_id} UNMAP{what}" + self._tail(a))

    def _mark(self, a: Access) -> None:
        self.started = True
        lost = _LOST_RE.fullmatch(a.text)
        if lost and a.ts == 0:
            n = int(lost[1])
            self.out.append(f"{'!' * 11} *** LOST {n} EVENT{'S' if n != 1 else ''}: the trace "
                            "has a gap here ***\n")
            return
        if (m := IRQ_TEXT_RE.fullmatch(a.text)) is not None:
            self._irq(to_us(a.ts), int(m[1]), m[2], m[3], m[4])
            return
        if (m := DMA_TEXT_RE.fullmatch(a.text)) is not None:
            self._dma(to_us(a.ts), m[1], m[2], int(m[3], 16), int(m[4]), m[5])
            return
        self._line(to_us(a.ts), f"MARK {a.text}\n")

    def _irq(self, ts: int, irq: int, dev: str, phase: str, what: str) -> None:
        if phase == "enter":
            self.irq_entries[irq] = ts
            self._line(ts, f"IRQ {irq} {what} ({dev})\n")
            return
        entry = self.irq_entries.pop(irq, None)
        took = f", {span(ts - entry)} after its entry" if entry is not None else ""
        self._line(ts, f"IRQ {irq} {what}{took}\n")

    def _dma(self, ts: int, kind: str, dev: str, addr: int, size: int, way: str) -> None:
        what = f"{way} {size} bytes ({kind}, {dev})"
        if kind in ("map", "alloc", "map-sg"):
            if len(self.dma) >= DMA_KEPT:
                del self.dma[next(iter(self.dma))]
            self.dma[addr] = (addr + size, f"{way} {size} bytes", ts)
        else:
            self.dma.pop(addr, None)
        self._line(ts, f"DMA 0x{addr:x} {what}\n")


# --- the command ---------------------------------------------------------------


def _symbols(args: argparse.Namespace, trace) -> Kallsyms | None:
    from ..common.errors import UsageError
    from ..common.symbols import Kallsyms, SymbolError

    if args.kallsyms:
        try:
            with open(args.kallsyms, encoding="utf-8", errors="replace") as fh:
                return Kallsyms(fh.read())
        except OSError as exc:
            raise UsageError(f"cannot read {args.kallsyms}: {exc.strerror}") from exc
        except SymbolError as exc:
            raise UsageError(f"{args.kallsyms}: {exc}") from exc
        except (ValueError, IndexError) as exc:
            raise UsageError(f"{args.kallsyms} is not a /proc/kallsyms listing") from exc
    return trace.symbols()


def _write_all(out: BinaryIO, data: bytes) -> None:
    """All of data: a buffered write cut short by an error (EPIPE, ENOSPC)
    returns the count it wrote; the retry raises the error."""
    view = memoryview(data)
    while view:
        n = out.write(view)
        view = view[len(view) if n is None else n:]


def run(args: argparse.Namespace) -> int:
    from ..common.errors import UsageError
    from ..common.output import writing
    from ..format.render import ENCODING, ERRORS
    from . import regmap
    from .tracefile import Trace, TraceError

    maps = [regmap.find(spec) for spec in args.regs] if args.regs else regmap.load_shipped()
    try:
        trace = Trace(args.file)
    except TraceError as exc:
        raise UsageError(str(exc)) from exc
    symbols = _symbols(args, trace)

    def note(msg: str) -> None:
        print(f"mmiotrace-ng: {msg}", file=sys.stderr, flush=True)

    ann = Annotator(maps, symbols, args.fold, note)
    try:
        with writing(args.output) as out:
            for chunk in trace.chunks(extras=True):
                for line in chunk:
                    ann.feed(line)
                _write_all(out, "".join(ann.take()).encode(ENCODING, ERRORS))
            ann.finish()
            _write_all(out, "".join(ann.take()).encode(ENCODING, ERRORS))
    except TraceError as exc:
        raise UsageError(str(exc)) from exc
    for m in maps:
        if args.regs and m.name not in ann.applied:
            ids = sorted({f"{t.vendor:04x}:{t.device:04x}" for t in m.targets})
            which = ids[0] if len(ids) == 1 else f"any of its {len(ids)} device ids"
            note(f"annotate: {m.name} not applied: no device {which} in the trace")
    if not args.regs and not ann.applied:
        note("annotate: no shipped register map fits a device of this trace (shipped: "
             f"{', '.join(regmap.shipped())}): offsets only (--regs MAP gives one)")
    return 0
