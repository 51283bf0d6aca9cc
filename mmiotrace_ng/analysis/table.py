"""A trace as three Arrow tables, written as Parquet by `export --parquet`
and queried by `query` (docs/sql.md has the schema, SCHEMA_VERSION):

- records: one row per record of the trace, in file order (seq): time, CPU,
  pid, pc with its function and module, kind, width, physical address, the
  device, BAR and offset in the BAR it falls in, value, map id, register
  name and fields (where a register map applies), the marker's text, the
  section (the text of the last MARK before the row); a recording's
  interrupts (IRQ: number, enter or exit, handler, result) and DMA mappings
  (DMA: what, bus address, size, direction, memory);
- devices: one row per BAR of each PCIDEV line (a device without BARs: one
  row, bar NULL);
- mappings: one row per MAP, with its UNMAP (NULL while never unmapped).

The records come in batches of about ROWS rows, so a trace of any length is
converted in constant memory.  A text trace is read through
accesses.events (tracefile.parse_line).  A recording's runs of access
records are read as columns (a NumPy view of the ring's bytes laid out as
records.NgRecAccess, the way the renderer reads them); any other record, and
any access the run cannot take as it is (lost events before it, an op that
is neither read nor write), goes through accesses.record_events.

pyarrow and NumPy are imported here: callers check for them first
(extras.require).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pac
import pyarrow.parquet as pq

from .. import __version__
from ..common import ringbuf
from ..common.errors import UsageError
from ..format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_WRITE
from ..format.records import NgRecAccess, NgRecHdr, NgRecType
from ..format.render import DMA_TEXT_RE, IRQ_TEXT_RE, dma_numbers, dma_words
from .accesses import NO_CPU, Event, RegisterNames, events, record_events, valid_text
from .annotate import parse_pcidev
from .tablefiles import SUFFIX, TABLES
from .tracefile import Trace, TraceError

SCHEMA_VERSION: Final = 2          # 2: IRQ and DMA rows, their columns
ROWS: Final = 1 << 18               # records per batch (and Parquet row group)
CACHE: Final = 1 << 16              # symbols, regions and fields remembered
META_KEY: Final = b"mmiotrace_ng.schema"

# kinds, by code in the batches' kind column
KINDS: Final = ("R", "W", "UNKNOWN", "MAP", "UNMAP", "MARK", "LOST", "UNTRACED", "IRQ", "DMA")
_CODE: Final = {k: i for i, k in enumerate(KINDS)}
R, W, UNKNOWN, MAP, UNMAP, MARK, LOST, UNTRACED, IRQ, DMA = range(len(KINDS))
_LOST_PREFIX: Final = "Lost "
_NOTE_PREFIX: Final = "mmiotrace-ng: "      # the tracer's notes (untraced ranges)

RECORDS: Final = pa.schema([
    ("seq", pa.int64()),            # the record's place in the file, from 0
    ("ts_ns", pa.int64()),
    ("cpu", pa.int16()),            # NULL: a text trace (no CPU column)
    ("pid", pa.int32()),
    ("pc", pa.uint64()),            # NULL: not known (0 in the trace)
    ("symbol", pa.string()),        # the function pc is in
    ("symbol_offset", pa.uint64()),
    ("module", pa.string()),        # NULL: the kernel itself, or no symbol
    ("kind", pa.string()),          # KINDS
    ("width", pa.uint8()),          # R, W
    ("phys", pa.uint64()),          # R, W, UNKNOWN, MAP, UNMAP (the mapping's start); DMA: memory
    ("bdf", pa.string()),           # the PCI device whose BAR phys is in; IRQ, DMA: the device
    ("bar", pa.int8()),             # 0-5, 6 the expansion ROM
    ("bar_offset", pa.uint64()),
    ("value", pa.uint64()),         # R, W
    ("map_id", pa.int32()),
    ("register", pa.string()),      # from a register map
    ("fields", pa.string()),        # the register's fields decoded: {F1=.. F2=..}
    ("insn", pa.string()),          # UNKNOWN: the first instruction bytes, xx,xx,xx
    ("virt", pa.uint64()),          # MAP
    ("length", pa.uint64()),        # MAP; DMA: the size
    ("text", pa.string()),          # MARK, LOST, UNTRACED: the line's text
    ("lost", pa.int64()),           # LOST: events dropped here
    ("section", pa.string()),       # the text of the last MARK before the row
    ("irq", pa.int32()),            # IRQ: the interrupt number
    ("event", pa.string()),         # IRQ: enter, exit; DMA: map, unmap, alloc, free, map-sg, ...
    ("handler", pa.string()),       # IRQ enter: the handler's name
    ("result", pa.string()),        # IRQ exit: handled, none, wake-thread
    ("dma_addr", pa.uint64()),      # DMA: the bus address the device uses
    ("direction", pa.string()),     # DMA: to-device, from-device, bidirectional, none
])

DEVICES: Final = pa.schema([
    ("bdf", pa.string()),
    ("vendor", pa.uint16()),
    ("device", pa.uint16()),
    ("ids", pa.string()),           # vvvv:dddd
    ("driver", pa.string()),
    ("bar", pa.int8()),             # NULL: the device has no BAR
    ("space", pa.string()),         # mem, io or rom
    ("start", pa.uint64()),
    ("size", pa.uint64()),
    ("line", pa.string()),          # the PCIDEV line
])

MAPPINGS: Final = pa.schema([
    ("map_id", pa.int32()),
    ("phys", pa.uint64()),
    ("length", pa.uint64()),
    ("virt", pa.uint64()),
    ("bdf", pa.string()),
    ("bar", pa.int8()),
    ("bar_offset", pa.uint64()),
    ("map_seq", pa.int64()),
    ("map_ns", pa.int64()),
    ("unmap_seq", pa.int64()),      # NULL: never unmapped in the trace
    ("unmap_ns", pa.int64()),
    ("cpu", pa.int16()),
    ("pid", pa.int32()),
    ("pc", pa.uint64()),
    ("symbol", pa.string()),
    ("module", pa.string()),
])

# columns Parquet dictionary-encodes: all but those of (nearly) unique values
DICTIONARY: Final = [f.name for f in RECORDS
                     if f.name not in ("seq", "ts_ns", "value", "virt", "length", "lost",
                                       "dma_addr")]

SCHEMAS: Final = {"records": RECORDS, "devices": DEVICES, "mappings": MAPPINGS}

# an access record's fields as NumPy reads them from the ring (after each
# record's 8-byte ring header), at the offsets ctypes gives them
_ACCESS_SIZE: Final = ctypes.sizeof(NgRecAccess)
_ACCESS_STRIDE: Final = ringbuf.stride(_ACCESS_SIZE)
_CT: Final = {ctypes.c_uint8: "u1", ctypes.c_uint16: "u2", ctypes.c_uint32: "u4",
              ctypes.c_int32: "i4", ctypes.c_uint64: "u8"}


def _access_dtype() -> np.dtype:
    names, formats, offsets = [], [], []
    for name, ctype in NgRecHdr._fields_:
        names.append(name)
        formats.append("<" + _CT[ctype])
        offsets.append(ringbuf.HEADER + NgRecAccess.hdr.offset + getattr(NgRecHdr, name).offset)
    for name in ("phys", "value", "ip", "map_id", "pid", "width", "op"):
        ctype = dict(NgRecAccess._fields_)[name]
        names.append(name)
        formats.append("<" + _CT[ctype])
        offsets.append(ringbuf.HEADER + getattr(NgRecAccess, name).offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": _ACCESS_STRIDE})


_ACCESS_DTYPE: Final = _access_dtype()
_RING_HEAD: Final = np.dtype({"names": ["len"], "formats": ["<u4"], "offsets": [0],
                              "itemsize": _ACCESS_STRIDE})


@dataclass
class _Region:
    start: int
    end: int
    bdf: str
    bar: int
    regmap: Any = None          # regmap.RegMap


@dataclass
class _Pending:
    """Rows not yet made into a batch: runs of accesses as NumPy columns,
    the other records as Python values."""

    runs: list[dict[str, np.ndarray]] = field(default_factory=list)
    rows: dict[str, list] = field(default_factory=lambda: {k: [] for k in _ROW_KEYS})
    texts: list[tuple[int, str, str]] = field(default_factory=list)  # (row, column, text)
    count: int = 0

    def close_rows(self) -> None:
        """The Python rows so far as one run (keeps the runs in file order)."""
        if not self.rows["seq"]:
            return
        run = {k: np.array(v, dtype=_ROW_TYPES[k]) for k, v in self.rows.items()}
        self.runs.append(run)
        self.rows = {k: [] for k in _ROW_KEYS}


_ROW_TYPES: Final = {"seq": np.int64, "ts": np.int64, "cpu": np.int16, "pid": np.int64,
                     "pc": np.uint64, "kind": np.uint8, "width": np.uint8, "phys": np.uint64,
                     "value": np.uint64, "map_id": np.int64, "virt": np.uint64,
                     "length": np.uint64, "lost": np.int64, "section": np.int64,
                     "irq": np.int64, "dma_addr": np.uint64}
_ROW_KEYS: Final = tuple(_ROW_TYPES)


class Converter:
    """A trace's tables: batches() yields the records' in order; devices()
    and mappings() are complete once it has run to the end."""

    def __init__(self, trace: Trace, namer: RegisterNames | None = None) -> None:
        self.trace = trace
        self.namer = namer
        self.symbols = trace.symbols()
        self.regions: list[_Region] = []
        self.device_rows: list[dict] = []
        self.open_maps: dict[int, dict] = {}
        self.mapping_rows: list[dict] = []
        self.map_phys: dict[int, int] = {}      # map id -> phys of the latest MAP
        self.seq = 0
        self.sections: list[str] = []           # texts of MARKs, by section number
        self.section = -1                       # the current one (-1: none yet)
        self.counts = dict.fromkeys(KINDS, 0)
        self._sym_cache: dict[int, tuple[str | None, int | None, str | None]] = {}
        self._region_cache: dict[int, tuple[int, int, int, str | None, Any]] = {}
        self._fields_cache: dict[tuple[int, int, int], str | None] = {}
        self.pending = _Pending()

    # -- reading

    def batches(self) -> Iterator[pa.RecordBatch]:
        try:
            if self.trace.recording is not None:
                yield from self._recorded()
            else:
                for ev in events(self.trace):
                    yield from self._event(ev)
        except (TraceError, OSError) as exc:
            raise UsageError(str(exc)) from exc
        for m in self.open_maps.values():
            self.mapping_rows.append(m)
        self.open_maps.clear()
        if self.pending.count:
            yield self._flush()

    def _recorded(self) -> Iterator[pa.RecordBatch]:
        rec = self.trace.recording
        assert rec is not None
        for line in rec.header.splitlines():
            if line.startswith("PCIDEV "):
                self._pcidev(line)
        last = 0
        for view in rec.ring_chunks():
            pos = 0
            end = len(view)
            words = view.cast("I") if end >= 4 else None
            while pos < end:
                n = ringbuf.run_of(view[pos:], _ACCESS_SIZE, ROWS - self.pending.count)
                if n and self._access_run(view, pos, n):
                    pos += n * _ACCESS_STRIDE
                    last = int(self.pending.runs[-1]["ts"][-1])
                else:
                    nxt = ringbuf.next_record(view, pos, words)
                    if nxt is None:
                        break
                    pos, raw = nxt
                    if raw is not None:
                        for ev in record_events(raw, extras=True):
                            last = ev.ts_ns
                            yield from self._event(ev)
                if self.pending.count >= ROWS:
                    yield self._flush()
        if rec.pending_lost:
            yield from self._event(Event("MARK", last, text=f"Lost {rec.pending_lost} events."))

    def _access_run(self, view: memoryview, pos: int, n: int) -> bool:
        """n access records from pos as columns; False (nothing taken) if one
        of them is not a plain read or write with no loss before it."""
        a = np.frombuffer(view, _ACCESS_DTYPE, count=n, offset=pos)
        op = a["op"]
        if (a["type"] != NgRecType.NG_REC_ACCESS).any() or a["lost"].any() \
                or ((op != MMIOTNG_OP_READ) & (op != MMIOTNG_OP_WRITE)).any():
            return False
        p = self.pending
        p.close_rows()
        kind = np.where(op == MMIOTNG_OP_READ, R, W).astype(np.uint8)
        p.runs.append({
            "seq": np.arange(self.seq, self.seq + n, dtype=np.int64),
            "ts": a["ts_ns"].astype(np.int64), "cpu": a["cpu"].astype(np.int16),
            "pid": a["pid"].astype(np.int64), "pc": a["ip"].copy(), "kind": kind,
            "width": a["width"].copy(), "phys": a["phys"].copy(), "value": a["value"].copy(),
            "map_id": a["map_id"].astype(np.int64),
            "section": np.full(n, self.section, dtype=np.int64)})
        self.seq += n
        p.count += n
        self.counts["R"] += int(np.count_nonzero(kind == R))
        self.counts["W"] += int(np.count_nonzero(kind == W))
        return True

    def _event(self, ev: Event) -> Iterator[pa.RecordBatch]:
        kind = ev.kind
        if kind == "PCIDEV":
            self._pcidev(ev.text)
            return
        text = ev.text
        lost = 0
        if kind == "MARK":
            if text.startswith(_LOST_PREFIX) and text.endswith(" events."):
                with contextlib.suppress(ValueError):
                    lost = int(text[len(_LOST_PREFIX):-len(" events.")])
                    kind = "LOST"
            elif text.startswith(_NOTE_PREFIX):
                kind = "UNTRACED"
            elif self.trace.recording is None:
                ev = _extra_of_text(ev)
                kind, text = ev.kind, ev.text
        code = _CODE[kind]
        phys, value, width, virt, length = ev.phys, ev.value, ev.width, 0, 0
        map_id, irq, dma_addr = ev.map_id, 0, 0
        strings: list[tuple[str, str]] = []     # (column, text) of IRQ and DMA rows
        if code == IRQ:
            dev, _, what = text.partition("\t")
            irq, map_id, phys, value, width = ev.map_id, 0, 0, 0, 0
            strings = [("dev", dev), ("event", "exit" if ev.width else "enter"),
                       ("result" if ev.width else "handler", what)]
        elif code == DMA:
            dma_addr, phys, length, value, width = ev.phys, ev.dma_phys, ev.length, 0, 0
            kind_word, way = dma_words(ev.width, ev.value)
            strings = [("dev", text), ("event", kind_word), ("direction", way)]
        elif code == MAP:
            virt, value, length = ev.value, 0, ev.length
            self.map_phys[ev.map_id] = ev.phys
            self._map(ev)
        elif code == UNMAP:
            phys = self.map_phys.get(ev.map_id, 0)
            self._unmap(ev)
        row = self.pending.rows
        i = self.pending.count
        row["seq"].append(self.seq)
        row["ts"].append(ev.ts_ns)
        row["cpu"].append(ev.cpu)
        row["pid"].append(ev.pid)
        row["pc"].append(ev.pc)
        row["kind"].append(code)
        row["width"].append(width)
        row["phys"].append(phys)
        row["value"].append(value)
        row["map_id"].append(map_id)
        row["virt"].append(virt)
        row["length"].append(length)
        row["lost"].append(lost)
        row["irq"].append(irq)
        row["dma_addr"].append(dma_addr)
        if code == MARK:
            self.sections.append(text)
            self.section = len(self.sections) - 1
        row["section"].append(self.section)
        if code in (MARK, LOST, UNTRACED):
            self.pending.texts.append((i, "text", valid_text(text)))
        elif code == UNKNOWN and text:
            self.pending.texts.append((i, "insn", text))
        for column, value_text in strings:
            self.pending.texts.append((i, column, valid_text(value_text)))
        self.seq += 1
        self.pending.count += 1
        self.counts[kind] += 1
        if self.pending.count >= ROWS:
            yield self._flush()

    # -- devices and mappings

    def _pcidev(self, line: str) -> None:
        if self.namer is not None:
            self.namer.pcidev(line)
        dev = parse_pcidev(line)
        if dev is None:
            return
        base = {"bdf": dev.bdf, "vendor": dev.vendor, "device": dev.device,
                "ids": f"{dev.vendor:04x}:{dev.device:04x}", "driver": dev.driver or None,
                "line": valid_text(line.rstrip("\n"))}
        bars = [(r.bar, "rom" if r.bar == 6 else "mem", r.start, r.size) for r in dev.regions]
        bars += [(bar, "io", port, size) for bar, port, size in dev.io]
        for bar, space, start, size in sorted(bars):
            self.device_rows.append({**base, "bar": bar, "space": space, "start": start,
                                     "size": size})
        if not bars:
            self.device_rows.append({**base, "bar": None, "space": None, "start": None,
                                     "size": None})
        for r in dev.regions:
            regmap = None
            if self.namer is not None:
                regmap = next((m for m in self.namer.maps
                               if r.bar in m.bars_for(r.vendor, r.device)), None)
            self.regions.append(_Region(r.start, r.end, r.bdf, r.bar, regmap))
        self._region_cache.clear()
        self._fields_cache.clear()

    def _map(self, ev: Event) -> None:
        old = self.open_maps.pop(ev.map_id, None)
        if old is not None:         # its id again, never unmapped
            self.mapping_rows.append(old)
        bdf, bar, off, _, _ = self._region(ev.phys)
        sym, _, module = self._symbol(ev.pc)
        self.open_maps[ev.map_id] = {
            "map_id": ev.map_id, "phys": ev.phys, "length": ev.length, "virt": ev.value,
            "bdf": self.regions[bdf].bdf if bdf >= 0 else None, "bar": bar if bdf >= 0 else None,
            "bar_offset": off if bdf >= 0 else None, "map_seq": self.seq,
            "map_ns": ev.ts_ns, "unmap_seq": None, "unmap_ns": None,
            "cpu": None if ev.cpu == NO_CPU else ev.cpu, "pid": ev.pid,
            "pc": ev.pc or None, "symbol": sym, "module": module}

    def _unmap(self, ev: Event) -> None:
        m = self.open_maps.pop(ev.map_id, None)
        if m is None:
            return
        m["unmap_seq"], m["unmap_ns"] = self.seq, ev.ts_ns
        self.mapping_rows.append(m)

    def devices(self) -> pa.Table:
        return pa.Table.from_pylist(self.device_rows, schema=DEVICES)

    def mappings(self) -> pa.Table:
        rows = sorted(self.mapping_rows, key=lambda m: m["map_seq"])
        return pa.Table.from_pylist(rows, schema=MAPPINGS)

    # -- lookups, each cached

    def _region(self, phys: int) -> tuple[int, int, int, str | None, Any]:
        """(index of the region phys is in or -1, its BAR, the offset, the
        register there, the register map's Register) for an address."""
        got = self._region_cache.get(phys)
        if got is not None:
            return got
        got = (-1, 0, 0, None, None)
        for i, r in enumerate(self.regions):
            if r.start <= phys < r.end:
                off = phys - r.start
                hit = r.regmap.lookup(off) if r.regmap is not None else None
                got = (i, r.bar, off, hit.name if hit else None, hit.reg if hit else None)
                break
        if len(self._region_cache) >= CACHE:
            self._region_cache.clear()
        self._region_cache[phys] = got
        return got

    def _symbol(self, pc: int) -> tuple[str | None, int | None, str | None]:
        got = self._sym_cache.get(pc)
        if got is not None:
            return got
        got = (None, None, None)
        if pc and self.symbols is not None:
            found = self.symbols.locate(pc)
            if found is not None:
                s, _ = found
                got = (s.name, pc - s.addr, s.module or None)
        if len(self._sym_cache) >= CACHE:
            self._sym_cache.clear()
        self._sym_cache[pc] = got
        return got

    def _fields(self, phys: int, width: int, value: int) -> str | None:
        key = (phys, width, value)
        got = self._fields_cache.get(key, "")
        if got != "":
            return got
        i, _, off, _, reg = self._region(phys)
        got = None
        if reg is not None and reg.fields:
            got = self.regions[i].regmap.describe(off, width, value)[1]
        if len(self._fields_cache) >= CACHE:
            self._fields_cache.clear()
        self._fields_cache[key] = got
        return got

    # -- making a batch

    def _flush(self) -> pa.RecordBatch:
        p = self.pending
        p.close_rows()
        cols = {k: np.concatenate([run[k] if k in run else np.zeros(len(run["seq"]),
                                                                    _ROW_TYPES[k])
                                   for run in p.runs]) for k in _ROW_KEYS}
        self.pending = _Pending()
        return self._batch(cols, p.texts, p.count)

    def _batch(self, c: dict[str, np.ndarray], texts: list[tuple[int, str, str]],
               n: int) -> pa.RecordBatch:
        kind = c["kind"]
        access = kind <= W
        has_phys = kind <= UNMAP
        pc = c["pc"]
        # per distinct pc: function, offset, module
        upc, pc_at = _distinct(pc)
        syms = [self._symbol(int(x)) for x in upc]
        sym_name = pa.array([s[0] for s in syms], pa.string()).take(pc_at)
        sym_off = pa.array([s[1] for s in syms], pa.uint64()).take(pc_at)
        sym_mod = pa.array([s[2] for s in syms], pa.string()).take(pc_at)
        # per distinct address: device, BAR, offset, register
        phys = np.where(has_phys, c["phys"], np.uint64(0))
        uphys, phys_at = _distinct(phys)
        regions = [self._region(int(x)) for x in uphys]
        inside = np.array([r[0] >= 0 for r in regions], dtype=bool)[phys_at] & has_phys
        bdf = pa.array([self.regions[r[0]].bdf if r[0] >= 0 else None for r in regions],
                       pa.string()).take(phys_at)
        bar = np.array([r[1] for r in regions], dtype=np.int8)[phys_at]
        off = np.array([r[2] for r in regions], dtype=np.uint64)[phys_at]
        register = pa.array([r[3] for r in regions], pa.string()).take(phys_at)
        with_fields = np.array([r[4] is not None and bool(r[4].fields) for r in regions],
                               dtype=bool)[phys_at] & access
        fields = self._field_column(c, with_fields, n)
        # sections: the batch's own dictionary of them
        sec = c["section"]
        usec, sec_at = _distinct(sec)
        section = pa.array([self.sections[s] if s >= 0 else None for s in usec],
                           pa.string()).take(sec_at)
        text_cols: dict[str, list[str | None]] = {}
        for i, col, t in texts:
            text_cols.setdefault(col, [None] * n)[i] = t

        def strings(col: str) -> pa.Array:
            got = text_cols.get(col)
            return pa.array(got, pa.string()) if got is not None else pa.nulls(n, pa.string())

        cpu = c["cpu"]
        pcs = pa.array(pc, pa.uint64(), mask=pc == 0)
        is_map = kind == MAP
        is_irq, is_dma = kind == IRQ, kind == DMA
        bdf = _masked(bdf, inside)
        if "dev" in text_cols:          # IRQ and DMA rows: their device
            bdf = pac.coalesce(strings("dev"), bdf)
        arrays = [
            pa.array(c["seq"], pa.int64()),
            pa.array(c["ts"], pa.int64()),
            pa.array(cpu, pa.int16(), mask=cpu == NO_CPU),
            pa.array(c["pid"].astype(np.int32), pa.int32()),
            pcs, sym_name, sym_off, sym_mod,
            pa.array(np.array(KINDS, dtype=object)[kind], pa.string()),
            pa.array(c["width"], pa.uint8(), mask=~access),
            pa.array(c["phys"], pa.uint64(),
                     mask=~(has_phys | (is_dma & (c["phys"] != 0)))),
            bdf,
            pa.array(bar, pa.int8(), mask=~inside),
            pa.array(off, pa.uint64(), mask=~inside),
            pa.array(c["value"], pa.uint64(), mask=~access),
            pa.array(c["map_id"].astype(np.int32), pa.int32(), mask=~has_phys),
            _masked(register, inside & (kind <= UNKNOWN)),
            fields,
            strings("insn"),
            pa.array(c["virt"], pa.uint64(), mask=~is_map),
            pa.array(c["length"], pa.uint64(), mask=~(is_map | is_dma)),
            strings("text"),
            pa.array(c["lost"], pa.int64(), mask=kind != LOST),
            section,
            pa.array(c["irq"].astype(np.int32), pa.int32(), mask=~is_irq),
            strings("event"),
            strings("handler"),
            strings("result"),
            pa.array(c["dma_addr"], pa.uint64(), mask=~is_dma),
            strings("direction"),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=RECORDS)

    def _field_column(self, c: dict[str, np.ndarray], rows: np.ndarray, n: int) -> pa.Array:
        """The fields of the rows that have them, decoded once per distinct
        (address, width, value)."""
        if not rows.any():
            return pa.nulls(n, pa.string())
        idx = np.nonzero(rows)[0]
        keys = np.stack([c["phys"][idx], c["width"][idx].astype(np.uint64),
                         c["value"][idx]], axis=1)
        ukeys, at = np.unique(keys, axis=0, return_inverse=True)
        texts = [self._fields(int(p), int(w), int(v)) for p, w, v in ukeys]
        out = np.full(n, -1, dtype=np.int64)
        out[idx] = at.reshape(-1)
        table = pa.array(texts + [None], pa.string())
        out[out < 0] = len(texts)
        return table.take(pa.array(out))


def _extra_of_text(ev: Event) -> Event:
    """A text trace's MARK line of --irq or --dma as the IRQ or DMA event a
    recording has for it (the memory's physical address unknown); any
    other MARK as it is."""
    if (m := IRQ_TEXT_RE.fullmatch(ev.text)) is not None:
        return Event("IRQ", ev.ts_ns, ev.cpu, int(m[1]), width=int(m[3] == "exit"),
                     pid=ev.pid, text=f"{m[2]}\t{m[4]}")
    if (m := DMA_TEXT_RE.fullmatch(ev.text)) is not None:
        numbers = dma_numbers(m[1], m[5])
        if numbers is not None:
            return Event("DMA", ev.ts_ns, ev.cpu, phys=int(m[3], 16), width=numbers[0],
                         value=numbers[1], pid=ev.pid, length=int(m[4]), text=m[2])
    return ev


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values (in order of first appearance) and, for each
    element, the index of its value among them (a hash table: faster than
    np.unique's sort)."""
    enc = pa.array(values).dictionary_encode()
    return enc.dictionary.to_numpy(), enc.indices.to_numpy()


def _masked(arr: pa.Array, keep: np.ndarray) -> pa.Array:
    """arr with NULL where keep is False."""
    if keep.all():
        return arr
    return pac.if_else(pa.array(keep), arr, pa.scalar(None, arr.type))


def file_metadata(trace: Trace, table: str) -> dict[bytes, bytes]:
    """Key-value metadata of each Parquet file: the schema's version, the
    source, the recording's META (host, boot id, kernel)."""
    import json

    meta = {META_KEY: str(SCHEMA_VERSION).encode(), b"mmiotrace_ng.table": table.encode(),
            b"mmiotrace_ng.exporter": f"mmiotrace-ng {__version__}".encode(),
            b"mmiotrace_ng.source": valid_text(trace.path).encode(),
            b"mmiotrace_ng.format": (b"mmiotrace-ng recording" if trace.recorded
                                     else b"mmiotrace 20070824")}
    if trace.recording is not None:
        meta[b"mmiotrace_ng.meta"] = json.dumps(trace.recording.meta, default=str).encode()
    return meta


def write_parquet(trace: Trace, out_dir: str, namer: RegisterNames | None = None,
                  compression: str = "zstd") -> dict[str, int]:
    """The trace's three tables as OUT_DIR/records.parquet, devices.parquet
    and mappings.parquet (made and replaced whole: written under other
    names first); the counts of the records' kinds."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make {out_dir}: {exc.strerror}") from exc
    paths = {t: os.path.join(out_dir, t + SUFFIX) for t in TABLES}
    tmp = {t: os.path.join(out_dir, f".{t}{SUFFIX}.part") for t in TABLES}
    conv = Converter(trace, namer)
    try:
        schema = RECORDS.with_metadata(file_metadata(trace, "records"))
        with pq.ParquetWriter(tmp["records"], schema, compression=compression,
                              use_dictionary=DICTIONARY) as w:
            for batch in conv.batches():
                w.write_batch(batch, row_group_size=ROWS)
        for name, table in (("devices", conv.devices()), ("mappings", conv.mappings())):
            table = table.replace_schema_metadata(file_metadata(trace, name))
            pq.write_table(table, tmp[name], compression=compression)
        for t in TABLES:
            os.replace(tmp[t], paths[t])
    except BaseException as exc:
        for path in tmp.values():
            with contextlib.suppress(OSError):
                os.unlink(path)
        if isinstance(exc, OSError):
            raise UsageError(f"cannot write {out_dir}: {exc.strerror or exc}") from exc
        raise
    return conv.counts
