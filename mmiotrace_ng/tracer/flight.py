"""The flight recorder: where its region is, and what a region holds.

The helper keeps the last accesses of each CPU in reserved memory that a warm
reboot keeps (kmod/mmiotng_flight.c; layout: struct mmiotng_flight_hdr in
kmod/mmiotng_abi.h).  The region is reserved on the kernel command line with
memmap=SIZE$ADDR, the way ramoops' memory is; `region()` finds it there (or
takes --flight-region SIZE@ADDR), `read_region()` copies it through the
helper, `parse()` makes a `Flight` of it and `payloads()` turns that into
the records a recording holds, which the renderer prints as the tracer does.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ..common.errors import UsageError
from ..format.abi import (
    MMIOTNG_FLIGHT_CRASHED,
    MMIOTNG_FLIGHT_MAGIC,
    MMIOTNG_FLIGHT_MIN_RECS,
    MMIOTNG_FLIGHT_OOPS,
    MMIOTNG_FLIGHT_PANIC,
    MMIOTNG_FLIGHT_READ_MAX,
    MMIOTNG_FLIGHT_RECORDING,
    MMIOTNG_FLIGHT_STOPPED,
    MMIOTNG_FLIGHT_VERSION,
    MmiotngFlightHdr,
    MmiotngFlightMap,
    MmiotngFlightRec,
)
from ..format.records import NG_MARK_MAX, NgRecAccess, NgRecMap, NgRecMark, NgRecType

if TYPE_CHECKING:
    from .netlink import HelperSocket

DEFAULT_RECS = 4096
SETUP_HINT = ("reserve memory for it on the kernel command line, e.g. memmap=2M\\$0x60000000 "
              "(RAM the kernel must not use: see the README's flight recorder section), reboot, "
              "and run again (or name it with --flight-region SIZE@ADDR)")

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class Region(NamedTuple):
    addr: int
    size: int

    def __str__(self) -> str:
        return f"{self.size:#x}@{self.addr:#x}"


def memparse(text: str) -> int:
    """A size or address as the kernel's memparse() reads it (0x.., K/M/G)."""
    m = re.fullmatch(r"(0[xX][0-9a-fA-F]+|[0-9]+)([kKmMgGtT]?)", text.strip())
    if not m:
        raise ValueError(f"not a size or address: {text!r}")
    return int(m[1], 0) * _SUFFIX[m[2].upper()]


def reserved_regions(cmdline: str) -> list[Region]:
    """The memmap=SIZE$ADDR reservations of a kernel command line, but the
    one ramoops.mem_address names (ramoops' own)."""
    ramoops = None
    found = []
    for word in cmdline.split():
        key, _, value = word.partition("=")
        if key == "ramoops.mem_address":
            try:
                ramoops = memparse(value)
            except ValueError:
                pass
        elif key == "memmap":
            for item in value.split(","):
                size, sep, addr = item.partition("$")
                if not sep:
                    continue
                try:
                    found.append(Region(memparse(addr), memparse(size)))
                except ValueError:
                    continue
    return [r for r in found if r.addr != ramoops]


def parse_region(spec: str) -> Region:
    """--flight-region SIZE@ADDR."""
    size, sep, addr = spec.partition("@")
    try:
        if not sep:
            raise ValueError(spec)
        return Region(memparse(addr), memparse(size))
    except ValueError:
        raise UsageError(f"--flight-region {spec!r}: expected SIZE@ADDR, "
                         "e.g. 2M@0x60000000") from None


def region(spec: str | None, cmdline: str) -> Region:
    """The flight region: --flight-region's, else the one memmap= reservation."""
    if spec:
        return parse_region(spec)
    found = reserved_regions(cmdline)
    if not found:
        raise UsageError(f"the flight recorder has no memory: {SETUP_HINT}")
    if len(found) > 1:
        raise UsageError("several memmap= reservations on the kernel command line ("
                         + ", ".join(map(str, found)) + "): name the flight recorder's with "
                         "--flight-region SIZE@ADDR")
    return found[0]


def read_region(helper: HelperSocket, where: Region, length: int | None = None) -> bytes:
    """The region's first length bytes (all of it by default), through the helper."""
    want = where.size if length is None else min(length, where.size)
    parts = []
    got = 0
    while got < want:
        chunk = helper.flight_read(where.addr, where.size, got)
        if not chunk:
            break
        parts.append(chunk[:want - got])
        got += len(parts[-1])
    return b"".join(parts)


HEADER_BYTES = ctypes.sizeof(MmiotngFlightHdr)
REASONS = {MMIOTNG_FLIGHT_PANIC: "panic", MMIOTNG_FLIGHT_OOPS: "oops"}
STATES = {MMIOTNG_FLIGHT_RECORDING: "recording", MMIOTNG_FLIGHT_STOPPED: "stopped",
          MMIOTNG_FLIGHT_CRASHED: "crashed"}


class FlightError(Exception):
    """The region holds no flight recorder's records (or not ones this version reads)."""


@dataclass
class Access:
    cpu: int
    seq: int
    rec: MmiotngFlightRec


@dataclass
class Flight:
    hdr: MmiotngFlightHdr
    maps: list[MmiotngFlightMap]
    accesses: list[Access]          # all CPUs, in time order
    wrapped_at: dict[int, int] = field(default_factory=dict)  # cpu: oldest kept ts

    @property
    def state(self) -> str:
        return STATES.get(self.hdr.state, f"state {self.hdr.state}")

    @property
    def crashed(self) -> bool:
        return self.hdr.state == MMIOTNG_FLIGHT_CRASHED

    def why(self) -> str:
        """The reason in words: what the kernel said, and the kind of death."""
        msg = self.hdr.message.decode(errors="replace").strip()
        kind = classify(self.hdr.reason, msg)
        then = " (then a panic)" if self.hdr.panicked and self.hdr.reason != \
            MMIOTNG_FLIGHT_PANIC else ""
        return f"{kind}: {msg}{then}" if msg else kind + then

    def complete_from(self) -> int:
        """The time from which every CPU's records are all here (0: all are)."""
        return max(self.wrapped_at.values(), default=0)


def classify(reason: int, message: str) -> str:
    """What killed the machine, from the helper's reason and the kernel's words."""
    low = message.lower()
    if reason == MMIOTNG_FLIGHT_OOPS:
        return "oops"
    if "sysrq triggered crash" in low:
        return "sysrq-c"
    if "hard lockup" in low or "hardlockup" in low:
        return "hard lockup"
    if "softlockup" in low or "soft lockup" in low:
        return "soft lockup"
    if "rcu stall" in low:
        return "lockup (RCU stall)"
    if "hung_task" in low or "hung tasks" in low:
        return "hung task"
    if reason == MMIOTNG_FLIGHT_PANIC:
        return "panic"
    return "unknown"


def _struct(cls: type, data: bytes, off: int):
    size = ctypes.sizeof(cls)
    if off < 0 or off + size > len(data):
        raise FlightError("the region is shorter than its header says")
    return cls.from_buffer_copy(data, off)


def parse(data: bytes, header_only: bool = False) -> Flight:
    """The records of a region's image, checked against its header (with
    header_only, the header alone: data may stop after it)."""
    if len(data) < ctypes.sizeof(MmiotngFlightHdr):
        raise FlightError("the region is smaller than the flight recorder's header")
    hdr = _struct(MmiotngFlightHdr, data, 0)
    if bytes(hdr.magic) != MMIOTNG_FLIGHT_MAGIC.encode():
        raise FlightError("the region holds no flight recorder's records")
    if hdr.version != MMIOTNG_FLIGHT_VERSION or hdr.rec_bytes != ctypes.sizeof(MmiotngFlightRec):
        raise FlightError(f"the region holds records of another layout (version {hdr.version})")
    if not hdr.cpus or not hdr.recs:
        raise FlightError("the region's header is damaged")
    if header_only:
        return Flight(hdr, [], [])
    msize = ctypes.sizeof(MmiotngFlightMap)
    maps = []
    for i in range(hdr.maps):
        m = _struct(MmiotngFlightMap, data, hdr.maps_off + i * msize)
        if m.seq and (m.seq - 1) % hdr.maps == i:
            maps.append(m)
    maps.sort(key=lambda m: m.seq)
    accesses: list[Access] = []
    wrapped: dict[int, int] = {}
    rsize = hdr.rec_bytes
    for cpu in range(hdr.cpus):
        base = hdr.recs_off + cpu * hdr.recs * rsize
        mine = []
        for slot in range(hdr.recs):
            r = _struct(MmiotngFlightRec, data, base + slot * rsize)
            if r.seq and (r.seq - 1) % hdr.recs == slot:
                mine.append(Access(cpu, r.seq, r))
        mine.sort(key=lambda a: a.seq)
        # a slot rewritten since (torn by a reset) leaves a hole: keep the newest run
        if mine and mine[0].seq > 1:
            wrapped[cpu] = mine[0].rec.ts_ns
        accesses += mine
    accesses.sort(key=lambda a: (a.rec.ts_ns, a.cpu, a.seq))
    return Flight(hdr, maps, accesses, wrapped)


def _mapping_of(flight: Flight, a: Access) -> MmiotngFlightMap | None:
    """The newest mapping in the table that holds this access."""
    for m in reversed(flight.maps):
        if m.virt == a.rec.map_virt and m.phys <= a.rec.phys < m.phys + max(m.size, 1):
            return m
    for m in reversed(flight.maps):
        if m.phys <= a.rec.phys < m.phys + max(m.size, 1):
            return m
    return None


def _mark(ts: int, cpu: int, text: str) -> bytes:
    rec = NgRecMark()
    rec.hdr.ts_ns = ts
    rec.hdr.type = NgRecType.NG_REC_MARK
    rec.hdr.cpu = cpu & 0xFFFF
    data = text.encode()[:NG_MARK_MAX]
    rec.len = len(data)
    ctypes.memmove(ctypes.addressof(rec) + NgRecMark.text.offset, data, len(data))
    return bytes(rec)[:NgRecMark.text.offset + len(data)]


def payloads(flight: Flight) -> Iterator[bytes]:
    """The region's records as a recording's: a MAP before the first access of
    each mapping, MARK lines for what the reader must know (which CPU the
    records that follow come from, where every CPU's records are complete,
    why the machine died)."""
    hdr = flight.hdr
    ids: dict[tuple[int, int, int], int] = {}
    first = flight.accesses[0].rec.ts_ns if flight.accesses else hdr.start_ns
    yield _mark(first, 0, f"mmiotrace-ng recover: {len(flight.accesses)} accesses kept, "
                f"the last {hdr.recs} of each CPU; the machine: {flight.state}")
    complete = flight.complete_from()
    # said where it is not the first access: from there on no CPU's are missing
    said_complete = not flight.accesses or flight.accesses[0].rec.ts_ns >= complete
    cpu = None
    for a in flight.accesses:
        r = a.rec
        if not said_complete and r.ts_ns >= complete:
            said_complete = True
            yield _mark(r.ts_ns, a.cpu, "mmiotrace-ng recover: every CPU's accesses from "
                        "here on (before, those of CPUs "
                        + ",".join(map(str, sorted(flight.wrapped_at))) + " were overwritten)")
        if a.cpu != cpu:
            cpu = a.cpu
            yield _mark(r.ts_ns, cpu, f"mmiotrace-ng recover: CPU {cpu}")
        m = _mapping_of(flight, a)
        key = (m.virt, m.phys, m.size) if m else (r.map_virt, r.phys, 0)
        map_id = ids.get(key)
        if map_id is None:
            map_id = ids[key] = len(ids) + 1
            mrec = NgRecMap()
            mrec.hdr.ts_ns = r.ts_ns
            mrec.hdr.type = NgRecType.NG_REC_MAP
            mrec.hdr.cpu = a.cpu
            mrec.phys, mrec.virt, mrec.len = key[1], key[0], key[2]
            mrec.map_id = map_id
            yield bytes(mrec)
        rec = NgRecAccess()
        rec.hdr.ts_ns = r.ts_ns
        rec.hdr.type = NgRecType.NG_REC_ACCESS
        rec.hdr.cpu = a.cpu
        rec.phys, rec.value, rec.ip = r.phys, r.value, r.ip
        rec.compat_value, rec.compat_width, rec.compat_op = r.value, r.width, r.op
        rec.width, rec.op, rec.flags = r.width, r.op, r.flags
        rec.map_id = map_id
        yield bytes(rec)
    if flight.crashed:
        yield _mark(hdr.crash_ns, max(hdr.crash_cpu, 0),
                    f"mmiotrace-ng recover: the machine died on CPU {hdr.crash_cpu}: "
                    f"{flight.why()}")


def header_text(flight: Flight) -> str:
    """The stream header the traced run printed (VERSION and PCIDEV lines)."""
    return flight.hdr.text.decode(errors="replace")


READ_CHUNK = MMIOTNG_FLIGHT_READ_MAX
MIN_RECS = MMIOTNG_FLIGHT_MIN_RECS      # per CPU, the least the helper keeps
