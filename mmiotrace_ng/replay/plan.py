"""A trace made into the accesses a replay makes, all checked before the
first one is made.

The trace is read with the readers every command uses (tracefile.py: text
of ours or of the kernel's tracer, or a recording rendered as `report`
prints it); its line numbers are those of that text.  Which of its
addresses belong to the device comes from its PCIDEV line for the device
(the same vendor:device; of several, the one at the same bus/devfn): its
memory BARs must be the device's, the same BAR numbers and sizes, and each
address is rebased BAR by BAR, by its offset in the BAR.  A trace without
PCIDEV lines has its MAP lines instead: each must lie inside one of the
device's BARs, at the device's own addresses.  Accesses to other devices
of the trace are left out (counted); an access past the end of its BAR,
a line that is not a trace line, an access of an unknown instruction
(UNKNOWN: no op, no value) and lost events make the trace unusable.

Polls: a run of reads of one register (same BAR, offset and width, nothing
between them) whose values are all the same but for the last's is one
step, done by reading until the last value comes; a run that changes value
more than once is cut after each change.  A read run whose values never
change is a poll that is over at its first read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from ..analysis.annotate import parse_pcidev
from ..analysis.tracefile import parse_line
from .device import FORMATS, DeviceInfo

_LOST: Final = re.compile(r"Lost \d+ events\.")
_UNTRACED: Final = re.compile(r"mmiotrace-ng: ioremap of .* is NOT traced")
PCI_ROM_BAR: Final = 6


class PlanError(Exception):
    """The trace cannot be replayed to the device (the message says why)."""


@dataclass(frozen=True)
class Selection:
    """Which part of the trace to replay."""

    first_line: int = 1
    last_line: int | None = None
    start_mark: str | None = None       # after the first MARK with this text
    stop_mark: str | None = None        # before the next MARK with this text
    only_writes: bool = False


@dataclass
class Step:
    """One thing to do, in trace order.  kind: R, W, MAP, UNMAP or MARK.
    A read's value is the value to see (a poll's: the last one read);
    reads > 1 makes it a poll of that many reads in the trace, from
    first_line to line."""

    kind: str
    line: int
    ts: float = 0.0
    map_id: int = 0
    bar: int = -1
    offset: int = 0
    width: int = 0
    value: int = 0
    phys: int = 0                # on the device (rebased)
    trace_phys: int = 0          # as the trace has it
    length: int = 0              # MAP
    text: str = ""               # MARK
    reads: int = 1
    first_line: int = 0
    busy: int | None = None      # a poll: the value of its reads before the last
    first_ts: float = 0.0        # a poll: the time of its first read

    def access(self) -> str:
        """How messages show the access: as the trace line has it."""
        return f"{self.kind} {self.width} {self.trace_phys:#x} {self.value:#x}"


@dataclass(frozen=True)
class TraceBar:
    index: int
    start: int
    size: int


@dataclass
class Plan:
    steps: list[Step]
    bars: dict[int, TraceBar]           # the trace's BARs of the device
    rebased: bool                       # the PCIDEV line's BARs, else the MAP lines
    other_accesses: int = 0             # accesses to other devices, left out
    untraced: list[str] = field(default_factory=list)   # NOT traced marks

    def used_bars(self) -> set[int]:
        return {s.bar for s in self.steps if s.kind in ("R", "W")}

    def accesses(self) -> list[Step]:
        return [s for s in self.steps if s.kind in ("R", "W")]


def _memory_bars(line: str) -> dict[int, TraceBar]:
    dev = parse_pcidev(line)
    assert dev is not None
    return {r.bar: TraceBar(r.bar, r.start, r.size) for r in dev.regions
            if r.bar != PCI_ROM_BAR}


def _pick_pcidev(lines: list[tuple[int, str]], info: DeviceInfo) -> str | None:
    """The PCIDEV line of the trace that is the device, None if the trace has
    none at all; PlanError if it has others only, or several alike."""
    if not lines:
        return None
    same = []
    for _, line in lines:
        dev = parse_pcidev(line)
        if dev is not None and (dev.vendor, dev.device) == (info.vendor, info.device):
            same.append(line)
    ids = f"{info.vendor:04x}:{info.device:04x}"
    if not same:
        raise PlanError(f"the trace has no device {ids} ({info.address} is one): it was "
                        "recorded of another device")
    if len(same) > 1:
        here = [line for line in same if int(line.split(" ")[1], 16) == info.busdevfn]
        if len(here) != 1:
            raise PlanError(f"the trace has {len(same)} devices {ids} and none of them, or "
                            f"more than one, at {info.address}'s bus/devfn: which one was "
                            "it?")
        same = here
    return same[0]


def _show_bars(bars: dict[int, int]) -> str:
    return ", ".join(f"BAR{i} {size:#x}" for i, size in sorted(bars.items())) or "none"


def check_layout(trace_bars: dict[int, TraceBar], info: DeviceInfo) -> None:
    """PlanError unless the trace's memory BARs are the device's: the same
    numbers, the same sizes."""
    want = {i: b.size for i, b in trace_bars.items()}
    have = {i: b.size for i, b in info.bars.items()}
    if want != have:
        raise PlanError(f"the trace's BARs ({_show_bars(want)}) are not {info.address}'s "
                        f"({_show_bars(have)}): another device, or another layout")


class _Reader:
    """The lines of a trace made into steps (before the selection)."""

    def __init__(self, info: DeviceInfo) -> None:
        self.info = info
        self.bars: dict[int, TraceBar] | None = None     # None: not known yet
        self.rebased = False
        self.pcidevs: list[tuple[int, str]] = []
        self.steps: list[Step] = []
        self.other = 0
        self.untraced: list[str] = []
        self._maps: dict[int, bool] = {}        # map id -> is the device's

    def _layout(self) -> None:
        """Called at the first record after the header."""
        line = _pick_pcidev(self.pcidevs, self.info)
        if line is None:
            self.bars = {}
            return
        self.bars = _memory_bars(line)
        self.rebased = True
        check_layout(self.bars, self.info)

    def _locate(self, phys: int, width: int, lineno: int) -> tuple[int, int] | None:
        """(BAR, offset) of an access at phys, None if it is not the device's."""
        if self.rebased:
            assert self.bars is not None
            for bar in self.bars.values():
                if bar.start <= phys < bar.start + bar.size:
                    if phys + width > bar.start + bar.size:
                        raise PlanError(f"line {lineno}: {width} bytes at {phys:#x} go past "
                                        f"the end of BAR{bar.index} ({bar.start:#x}+"
                                        f"{bar.size:#x})")
                    return bar.index, phys - bar.start
            return None
        for bar in self.info.bars.values():
            if bar.start <= phys <= bar.end:
                if phys + width > bar.end + 1:
                    raise PlanError(f"line {lineno}: {width} bytes at {phys:#x} go past "
                                    f"the end of {self.info.address}'s BAR{bar.index}")
                return bar.index, phys - bar.start
        return None

    def _device_phys(self, bar: int, offset: int) -> int:
        return self.info.bars[bar].start + offset

    def feed(self, lineno: int, line: str) -> None:
        if not line.strip() or line.startswith("#"):
            return
        a = parse_line(line)
        kind = a.kind
        if kind == "VERSION":
            return
        if kind == "PCIDEV":
            if self.bars is not None:
                raise PlanError(f"line {lineno}: a PCIDEV line after the records: the trace "
                                "is damaged")
            if parse_pcidev(line) is None:
                raise PlanError(f"line {lineno} is not a PCIDEV line as the tracers print "
                                f"them: {line.rstrip()!r}")
            self.pcidevs.append((lineno, line))
            return
        if kind == "?":
            raise PlanError(f"line {lineno} is not a trace line: {line.rstrip()[:60]!r} "
                            "(the trace is damaged)")
        if self.bars is None:
            self._layout()
        if kind == "UNKNOWN":
            if self._locate(a.phys, 1, lineno) is None:
                self.other += 1
                return
            raise PlanError(f"line {lineno}: an access by an instruction the tracer did not "
                            "decode (UNKNOWN): its op and value are not known, it cannot be "
                            "replayed")
        if kind == "MARK":
            if _LOST.fullmatch(a.text):
                raise PlanError(f"line {lineno}: the trace lost events there ({a.text}): a "
                                "replay of it would leave accesses out")
            if _UNTRACED.match(a.text):
                self.untraced.append(f"line {lineno}: {a.text}")
            self.steps.append(Step("MARK", lineno, a.ts, text=a.text))
            return
        if kind == "MAP":
            self._map(lineno, a.ts, a.map_id, a.phys, a.length)
            return
        if kind == "UNMAP":
            if self._maps.pop(a.map_id, False):
                self.steps.append(Step("UNMAP", lineno, a.ts, a.map_id))
            return
        self._access(lineno, a.kind, a.ts, a.map_id, a.phys, a.width, a.value)

    def _map(self, lineno: int, ts: float, map_id: int, phys: int, length: int) -> None:
        where = self._locate(phys, 1, lineno)
        if where is None:
            if not self.rebased:
                have = ", ".join(f"BAR{b.index} {b.start:#x}+{b.size:#x}"
                                 for b in self.info.bars.values())
                raise PlanError(f"line {lineno}: MAP {phys:#x} {length:#x} is not inside a "
                                f"BAR of {self.info.address} ({have}), and the trace has no "
                                "PCIDEV line to rebase it by: another device, or another "
                                "layout")
            self._maps[map_id] = False
            return
        bar, offset = where
        self._maps[map_id] = True
        self.steps.append(Step("MAP", lineno, ts, map_id, bar, offset,
                               phys=self._device_phys(bar, offset), trace_phys=phys,
                               length=length))

    def _access(self, lineno: int, kind: str, ts: float, map_id: int, phys: int,
                width: int, value: int) -> None:
        if width not in FORMATS:
            raise PlanError(f"line {lineno}: a {width}-byte access (1, 2, 4 or 8 bytes are "
                            "made): the trace is damaged")
        if value >> 8 * width:
            raise PlanError(f"line {lineno}: {value:#x} does not fit {width} bytes: the "
                            "trace is damaged")
        where = self._locate(phys, width, lineno)
        if where is None:
            self.other += 1
            return
        bar, offset = where
        self.steps.append(Step(kind, lineno, ts, map_id, bar, offset, width, value,
                               self._device_phys(bar, offset), phys, first_line=lineno,
                               first_ts=ts))

    def finish(self) -> None:
        if self.bars is None:
            self._layout()


def _select(steps: list[Step], sel: Selection) -> list[Step]:
    start = 0
    if sel.start_mark is not None:
        found = next((i for i, s in enumerate(steps)
                      if s.kind == "MARK" and s.text == sel.start_mark), None)
        if found is None:
            raise PlanError(f"no MARK {sel.start_mark!r} in the trace (--from)")
        start = found + 1
    end = len(steps)
    if sel.stop_mark is not None:
        found = next((i for i in range(start, len(steps))
                      if steps[i].kind == "MARK" and steps[i].text == sel.stop_mark), None)
        if found is None:
            raise PlanError(f"no MARK {sel.stop_mark!r} in the trace"
                            + (" after the --from one" if sel.start_mark is not None else "")
                            + " (--until)")
        end = found
    last = sel.last_line
    return [s for s in steps[start:end]
            if s.line >= sel.first_line and (last is None or s.line <= last)
            and not (sel.only_writes and s.kind == "R")]


def fold_polls(steps: list[Step]) -> list[Step]:
    """Runs of reads of one register made into polls (see the module's doc)."""
    out: list[Step] = []
    for s in steps:
        prev = out[-1] if out else None
        if (s.kind == "R" and prev is not None and prev.kind == "R"
                and (prev.bar, prev.offset, prev.width) == (s.bar, s.offset, s.width)
                and (prev.busy is None or prev.busy == prev.value)):
            prev.busy = prev.value
            prev.value = s.value
            prev.line = s.line
            prev.ts = s.ts
            prev.reads += 1
            prev.map_id = s.map_id
            continue
        out.append(s)
    return out


def make_plan(lines: Iterable[str], info: DeviceInfo, sel: Selection) -> Plan:
    """The steps of replaying the trace's lines to the device; PlanError if
    the trace cannot be replayed to it."""
    reader = _Reader(info)
    for lineno, line in enumerate(lines, 1):
        reader.feed(lineno, line)
    reader.finish()
    assert reader.bars is not None
    steps = _select(reader.steps, sel)
    if not any(s.kind in ("R", "W") for s in steps):
        raise PlanError("nothing to replay: no access to the device"
                        + (" in the part selected" if sel != Selection() else "")
                        + (f" ({reader.other} to other devices)" if reader.other else ""))
    return Plan(fold_polls(steps), reader.bars, reader.rebased, reader.other,
                reader.untraced)
