"""`mmiotrace-ng export --chrome OUT.json FILE`: a trace as Chrome
trace-event JSON, which Perfetto's UI (ui.perfetto.dev) and chrome://tracing
open.  (`export --parquet DIR FILE`: the trace as Parquet tables, made by
table.py.)

The object form of the Trace Event Format is written:
{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}, with
times in microseconds.  What goes where:

- process 1 ("mmiotrace-ng") holds everything but what processes did
  through their own mappings of a BAR; in a recorded file each CPU is a
  thread (tid = the CPU, named "CPU n"); a text trace has no CPU column,
  so its accesses share one thread ("MMIO", tid 0);
- a process's mapping (a MAP at a user address) and the accesses through
  it go to that process's own track (pid = its pid, named "process PID"),
  with the same threads;
- each R, W and UNKNOWN is a complete event ("X") on its CPU's thread,
  named "R 4 +0x0008" (op, width, offset in its mapping), or "R NAME" where
  a register map (--regs; default: the shipped ones) names the register;
  its value, address, width and caller in args.  An access lasts until just
  before the next one on its CPU, at most ACCESS_NS: the events
  of a thread never overlap, as complete events must not partially;
- a MAP .. UNMAP is a nestable async span ("b"/"e", cat "map", id the map
  id): mappings overlap freely, which B/E pairs (a per-thread stack) cannot;
  one never unmapped ends at the trace's last time;
- a MARK line (Lost markers too) is a global instant ("i", "s": "g");
- a recording's interrupts (IRQ records): each interrupt number a thread
  of its own (tid IRQ_TID + the number, named "irq N DEVICE"), each
  handler run a complete event from its entry to its exit, named "irq N
  HANDLER", its result in args;
- its DMA mappings (DMA records): nestable async spans (cat "dma") on one
  thread ("DMA", tid DMA_TID), from the map or alloc to the unmap or free
  of the same bus address, named "DMA 0xADDR +SIZE DIRECTION".

The events are written in time order (the metadata first), whatever the
order of the records (the CPUs' records interleave out of order in a
recording): sorted in bounded memory (timeorder: batches spilled to
temporary files and merged), so a trace of any length is exported; the
counts go into otherData at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import sys
from collections.abc import Callable
from typing import IO, Final

from .. import __version__
from ..common.errors import UsageError
from ..format.render import DMA_KINDS, ENCODING, dma_words
from ..format.timeorder import TimeOrder
from .accesses import (
    NO_CPU,
    Event,
    Namer,
    events,
    feed_pcidev,
    note_unapplied,
    open_trace,
    register_namer,
    valid_text,
)
from .tracefile import Trace

PID: Final = 1
TEXT_TID: Final = 0             # the one thread of a text trace
ACCESS_NS: Final = 1000         # an access's duration if the next is later
MAX_PCIDEV: Final = 1024        # header lines kept for otherData
CACHE: Final = 1 << 16          # JSON pieces kept (registers, callers)
IRQ_TID: Final = 1_000_000      # an interrupt's track: IRQ_TID + its number
DMA_TID: Final = 999_999        # the DMA mappings' track
_COUNT_KEYS: Final = {"R": "reads", "W": "writes", "UNKNOWN": "unknowns", "MAP": "maps",
                      "UNMAP": "unmaps", "MARK": "marks", "IRQ": "interrupt_records",
                      "DMA": "dma_records"}
_DUMPS: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def setup(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("file", metavar="FILE",
                    help="a trace: text (20070824) or recorded; - for standard input")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--chrome", metavar="OUT.json",
                      help="write Chrome trace-event JSON here (- for standard output)")
    what.add_argument("--parquet", metavar="OUT",
                      help="write the trace as Parquet tables into the directory OUT "
                           "(made if missing): records.parquet, devices.parquet, "
                           "mappings.parquet (docs/sql.md; needs pyarrow)")
    ap.add_argument("--regs", action="append", default=[], metavar="MAP",
                    help="register map: a .regs file or the name of a shipped one (e1000, "
                         "edu); repeatable; default: every shipped map, each where its "
                         "device is in the trace")


def run(args: argparse.Namespace) -> int:
    trace = open_trace(args.file)
    if args.parquet is not None:
        from .extras import require

        require("export --parquet", ("pyarrow", "numpy"))
    namer = register_namer(args.regs)
    if args.parquet is not None:
        from .table import write_parquet

        write_parquet(trace, args.parquet, namer)
        status = 0
    else:
        status = _write(args, trace, namer)
    note_unapplied(namer, args.regs, "export")
    return status


def _write(args: argparse.Namespace, trace: Trace, namer: Namer | None) -> int:
    if args.chrome == "-":
        try:
            sys.stdout.flush()
            fh = io.TextIOWrapper(sys.stdout.buffer, encoding=ENCODING, errors="replace")
            try:
                write_chrome(trace, fh, namer)
                fh.flush()
            finally:
                fh.detach()     # sys.stdout's buffer stays open
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                from ..common.output import closed_pipe

                return closed_pipe()
            raise UsageError(f"cannot write standard output: {exc.strerror}") from exc
        return 0
    try:
        fh = open(args.chrome, "w", encoding=ENCODING, errors="replace")  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"cannot write {args.chrome}: {exc.strerror}") from exc
    try:
        with fh:
            write_chrome(trace, fh, namer)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(args.chrome)      # no half-written JSON left behind
        if isinstance(exc, OSError):
            raise UsageError(f"cannot write {args.chrome}: {exc.strerror}") from exc
        raise
    return 0


def _us(ns: int) -> float | int:
    """Nanoseconds as the format's microseconds (an int when whole)."""
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


class ChromeWriter:
    """Turns events into trace events on fh, one JSON object a line."""

    def __init__(self, fh: IO[str], namer: Namer | None = None) -> None:
        self.fh = fh
        self.namer = namer
        self.order = TimeOrder()
        self.threads: set[tuple[int, int]] = set()         # (pid, tid)
        self.pending: dict[tuple[int, int], tuple[int, str]] = {}  # (pid, tid) -> (ts_ns, JSON)
        self.heads: dict[tuple, str] = {}                  # see access()
        self.callers: dict[int, str] = {}
        self.latest: dict[tuple[int, int], int] = {}       # (pid, tid) -> latest ts_ns
        self.maps: dict[int, tuple[str, int, int]] = {}    # map id -> (name, pid, tid): open
        self.user_maps: dict[int, int] = {}                # map id -> its process
        self.bases: dict[int, int] = {}                    # map id -> its phys
        self.last_ns = 0
        self.counts = dict.fromkeys(("R", "W", "UNKNOWN", "MAP", "UNMAP", "MARK"), 0)
        self.irqs: dict[int, tuple[int, str]] = {}     # irq -> (entry's ts_ns, handler)
        self.dma: dict[tuple[str, int], tuple[str, int]] = {}  # (dev, addr) -> (name, id)
        self.dma_ids = 0
        self.symbols: Callable[[int], str] | None = None

    def emit(self, ev: dict, ts_ns: int = -1) -> None:
        """An event at ts_ns (-1: metadata, before every other event)."""
        self.order.add(ts_ns, _DUMPS(ev))

    def begin(self, other: dict[str, str]) -> None:
        self.fh.write('{"displayTimeUnit":"ns","traceEvents":[')
        self.emit({"name": "process_name", "ph": "M", "pid": PID, "tid": 0,
                   "args": {"name": "mmiotrace-ng"}})
        self.other = other

    def thread(self, tid: int, name: str, pid: int = PID) -> None:
        if (pid, tid) not in self.threads:
            if pid != PID and not any(p == pid for p, _ in self.threads):
                self.emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"name": f"process {pid}"}})
                self.emit({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
            self.threads.add((pid, tid))
            self.emit({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": name}})
            self.emit({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})

    def feed(self, ev: Event) -> None:
        kind = ev.kind
        if kind == "PCIDEV":
            feed_pcidev(self.namer, ev.text)
            self.heads.clear()
            return
        ts = ev.ts_ns
        self.last_ns = max(self.last_ns, ts)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind == "IRQ":
            self.irq(ev)
            return
        if kind == "DMA":
            self.dma_event(ev)
            return
        tid = TEXT_TID if ev.cpu == NO_CPU else ev.cpu
        if kind in ("R", "W", "UNKNOWN"):
            self.access(ev, tid)
        elif kind == "MARK":
            self.emit({"name": valid_text(ev.text) or "MARK", "ph": "i", "s": "g", "ts": _us(ts),
                       "pid": PID, "tid": tid, "cat": "mark"}, ts)
        elif kind == "MAP":
            self.map(ev, tid)
        elif kind == "UNMAP":
            self.unmap(ev, tid)

    def caller(self, pc: int) -> str:
        return self.symbols(pc) if self.symbols is not None else f"0x{pc:x}"

    def access(self, ev: Event, tid: int) -> None:
        # The JSON text of an event is made by hand from pieces that are
        # cached: a register's part (name, address) and a caller's.
        proc = self.user_maps.get(ev.map_id, PID)
        key = (ev.kind, ev.width, ev.map_id, ev.phys, tid)
        head = self.heads.get(key)
        if head is None:
            if len(self.heads) >= CACHE:
                self.heads.clear()
            head = self.heads[key] = self.head(ev, tid, proc)
        if ev.kind == "UNKNOWN":
            tail = ',"insn":' + _DUMPS(ev.text)
        else:
            tail = f',"value":"0x{ev.value:x}"'
        if ev.pc:
            caller = self.callers.get(ev.pc)
            if caller is None:
                if len(self.callers) >= CACHE:
                    self.callers.clear()
                caller = self.callers[ev.pc] = ',"caller":' + _DUMPS(self.caller(ev.pc))
            tail += caller
        if ev.pid:
            tail += f',"pid":{ev.pid}'
        body = head + tail + '},"ts":'
        # An access lasts until 1 ns before the next on its thread (a margin
        # for the rounding of times in microseconds), at most ACCESS_NS; one
        # out of time order lasts 0: the thread's events of non-zero length
        # then never overlap one another.
        ts = ev.ts_ns
        track = (proc, tid)
        latest = self.latest.get(track)
        held = self.pending.pop(track, None)
        if held is not None:
            self.complete(held, max(0, min(ACCESS_NS, ts - held[0] - 1)))
        if latest is not None and ts < latest:
            self.complete((ts, body), 0)
        else:
            self.latest[track] = ts
            self.pending[track] = (ts, body)

    def complete(self, held: tuple[int, str], dur_ns: int) -> None:
        ts, body = held
        self.order.add(ts, f'{body}{_us(ts)},"dur":{_us(dur_ns)}}}')

    def head(self, ev: Event, tid: int, proc: int = PID) -> str:
        """The JSON of an access event up to its value: name, track, address."""
        self.thread(tid, "MMIO" if ev.cpu == NO_CPU else f"CPU {ev.cpu}", proc)
        name = self.namer(ev.phys) if self.namer is not None else None
        base = self.bases.get(ev.map_id)
        where = f"+0x{ev.phys - base:04x}" if base is not None and ev.phys >= base \
            else f"0x{ev.phys:x}"
        if ev.kind == "UNKNOWN":
            label = f"UNKNOWN {name or where}"
        else:
            label = f"{ev.kind} {name}" if name else f"{ev.kind} {ev.width} {where}"
        args: dict[str, object] = {"phys": f"0x{ev.phys:x}", "map": ev.map_id,
                                   "offset": where}
        if ev.kind != "UNKNOWN":
            args["width"] = ev.width
        if name:
            args["register"] = name
        head = {"name": label, "ph": "X", "pid": proc, "tid": tid, "cat": "mmio", "args": args}
        return _DUMPS(head)[:-2]         # without the closing }} of args and event

    def map(self, ev: Event, tid: int) -> None:
        if ev.map_id in self.maps:      # never unmapped, and its id again: end it here
            self.unmap(ev._replace(kind="UNMAP"), tid)
        name = f"map {ev.map_id}: 0x{ev.phys:x} +0x{ev.length:x}"
        self.bases[ev.map_id] = ev.phys
        self.heads.clear()      # they hold offsets in the mappings
        proc = PID
        self.user_maps.pop(ev.map_id, None)
        if ev.pid and not ev.value >> 63:       # at a user address: a process's
            proc = self.user_maps[ev.map_id] = ev.pid
            self.thread(tid, "MMIO" if ev.cpu == NO_CPU else f"CPU {ev.cpu}", proc)
            name += f" (process {ev.pid} at 0x{ev.value:x})"
        self.maps[ev.map_id] = (name, proc, tid)
        args: dict[str, object] = {"phys": f"0x{ev.phys:x}", "virt": f"0x{ev.value:x}",
                                   "len": f"0x{ev.length:x}"}
        if ev.pc:
            args["caller"] = self.caller(ev.pc)
        self.emit({"name": name, "ph": "b", "cat": "map", "id": ev.map_id, "ts": _us(ev.ts_ns),
                   "pid": proc, "tid": tid, "args": args}, ev.ts_ns)

    def unmap(self, ev: Event, tid: int) -> None:
        opened = self.maps.pop(ev.map_id, None)
        if opened is None:          # a mapping this trace did not see made
            self.emit({"name": f"UNMAP {ev.map_id}", "ph": "i", "s": "t", "ts": _us(ev.ts_ns),
                       "pid": PID, "tid": tid, "cat": "map"}, ev.ts_ns)
            return
        name, proc, btid = opened
        self.emit({"name": name, "ph": "e", "cat": "map", "id": ev.map_id,
                   "ts": _us(ev.ts_ns), "pid": proc, "tid": btid}, ev.ts_ns)

    def irq(self, ev: Event) -> None:
        """An interrupt handler's run: a span on its interrupt's track, from
        its entry to its exit."""
        dev, what = ev.text.split("\t", 1)
        tid = IRQ_TID + ev.map_id
        self.thread(tid, f"irq {ev.map_id} {dev}")
        if not ev.width:
            self.irqs[ev.map_id] = (ev.ts_ns, what)
            return
        entry = self.irqs.pop(ev.map_id, None)
        if entry is None:       # its entry came before the trace
            self.emit({"name": f"irq {ev.map_id} exit {what}", "ph": "i", "s": "t",
                       "ts": _us(ev.ts_ns), "pid": PID, "tid": tid, "cat": "irq"}, ev.ts_ns)
            return
        start, handler = entry
        self.order.add(start, _DUMPS({
            "name": f"irq {ev.map_id} {handler}", "ph": "X", "pid": PID, "tid": tid,
            "cat": "irq", "ts": _us(start), "dur": _us(max(0, ev.ts_ns - start)),
            "args": {"device": dev, "result": what, "cpu": ev.cpu}}))

    def dma_event(self, ev: Event) -> None:
        """A DMA mapping: a span from its map (or alloc) to its unmap (or
        free) on the DMA track."""
        self.thread(DMA_TID, "DMA")
        kind, way = dma_words(ev.width, ev.value)
        key = (ev.text, ev.phys)
        args = {"device": ev.text, "bus_address": f"0x{ev.phys:x}", "size": ev.length,
                "direction": way, "kind": kind}
        if kind in ("map", "alloc", "map-sg"):
            if key in self.dma:         # mapped again unseen: end the first here
                self.dma_event(ev._replace(width=DMA_KINDS.index("unmap")))
            self.dma_ids += 1
            name = f"DMA 0x{ev.phys:x} +{ev.length} {way}"
            self.dma[key] = (name, self.dma_ids)
            self.emit({"name": name, "ph": "b", "cat": "dma", "id": self.dma_ids,
                       "ts": _us(ev.ts_ns), "pid": PID, "tid": DMA_TID, "args": args}, ev.ts_ns)
            return
        opened = self.dma.pop(key, None)
        if opened is None:              # mapped before the trace
            self.emit({"name": f"DMA {kind} 0x{ev.phys:x}", "ph": "i", "s": "t",
                       "ts": _us(ev.ts_ns), "pid": PID, "tid": DMA_TID, "cat": "dma",
                       "args": args}, ev.ts_ns)
            return
        name, ident = opened
        self.emit({"name": name, "ph": "e", "cat": "dma", "id": ident, "ts": _us(ev.ts_ns),
                   "pid": PID, "tid": DMA_TID}, ev.ts_ns)

    def end(self) -> None:
        for name, ident in list(self.dma.values()):
            self.emit({"name": name, "ph": "e", "cat": "dma", "id": ident,
                       "ts": _us(self.last_ns), "pid": PID, "tid": DMA_TID,
                       "args": {"unmapped": "no (still mapped at the end of the trace)"}},
                      self.last_ns)
        self.dma.clear()
        for track in list(self.pending):
            self.complete(self.pending.pop(track), ACCESS_NS)
        for map_id, (name, proc, tid) in list(self.maps.items()):
            self.emit({"name": name, "ph": "e", "cat": "map", "id": map_id,
                       "ts": _us(self.last_ns), "pid": proc, "tid": tid,
                       "args": {"unmapped": "no (still mapped at the end of the trace)"}},
                      self.last_ns)
        self.maps.clear()
        sep = "\n"
        for _, text in self.order.items():
            self.fh.write(sep + text)
            sep = ",\n"
        other = dict(self.other)
        other.update({_COUNT_KEYS[k]: str(n) for k, n in self.counts.items()})
        self.fh.write('\n],"otherData":' + _DUMPS(other) + "}\n")


def write_chrome(trace: Trace, fh: IO[str], namer: Namer | None = None) -> dict[str, int]:
    """Write the trace's events to fh as Chrome trace-event JSON; the counts
    of what was written (R, W, UNKNOWN, MAP, UNMAP, MARK; IRQ and DMA
    records of a recording too, each interrupt a track of its own and the
    DMA mappings spans on one)."""
    w = ChromeWriter(fh, namer)
    syms = trace.symbols()
    if syms is not None:
        w.symbols = syms.function
    other = {"source": valid_text(trace.path), "exporter": f"mmiotrace-ng {__version__}",
             "format": "mmiotrace-ng recording" if trace.recorded else "mmiotrace 20070824"}
    if trace.recording is not None:
        other.update({f"meta.{k}": v if isinstance(v, str) else json.dumps(v)
                      for k, v in trace.recording.meta.items()})
    w.begin(other)
    pcidev: list[str] = []
    for ev in events(trace, extras=True):
        if ev.kind == "PCIDEV" and len(pcidev) < MAX_PCIDEV:
            pcidev.append(valid_text(ev.text))
        w.feed(ev)
    if pcidev:
        w.other["pcidev"] = "\n".join(pcidev)
    w.end()
    return dict(w.counts)
