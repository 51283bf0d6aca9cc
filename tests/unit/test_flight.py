"""The flight region's reading (mmiotrace_ng/tracer/flight.py) on images
laid out here from the C header's structs (their layout is checked against
the compiler by test_abi.py), and the text recover makes of them, compared
with lines written out from the values put in."""

from __future__ import annotations

import ctypes

import pytest

from mmiotrace_ng.common.errors import UsageError
from mmiotrace_ng.format.abi import (
    MMIOTNG_FLIGHT_CRASHED,
    MMIOTNG_FLIGHT_MAGIC,
    MMIOTNG_FLIGHT_OOPS,
    MMIOTNG_FLIGHT_PANIC,
    MMIOTNG_FLIGHT_STOPPED,
    MMIOTNG_FLIGHT_VERSION,
    MMIOTNG_OP_READ,
    MMIOTNG_OP_WRITE,
    MmiotngFlightHdr,
    MmiotngFlightMap,
    MmiotngFlightRec,
)
from mmiotrace_ng.format.render import Renderer
from mmiotrace_ng.tracer import flight

MAPS = 4
HDR = ctypes.sizeof(MmiotngFlightHdr)
MAPS_OFF = (HDR + 63) // 64 * 64
RECS_OFF = MAPS_OFF + MAPS * ctypes.sizeof(MmiotngFlightMap)
RSIZE = ctypes.sizeof(MmiotngFlightRec)


class Image:
    """A region as the helper leaves it: cpus rings of recs records."""

    def __init__(self, cpus: int = 2, recs: int = 4, state: int = MMIOTNG_FLIGHT_CRASHED):
        self.cpus, self.recs = cpus, recs
        self.data = bytearray(RECS_OFF + cpus * recs * RSIZE)
        h = MmiotngFlightHdr()
        ctypes.memmove(h.magic, MMIOTNG_FLIGHT_MAGIC.encode(), 8)
        h.version, h.state, h.cpus, h.recs = MMIOTNG_FLIGHT_VERSION, state, cpus, recs
        h.rec_bytes, h.maps, h.maps_off, h.recs_off = RSIZE, MAPS, MAPS_OFF, RECS_OFF
        h.crash_cpu, h.reason, h.crash_ns = 1, MMIOTNG_FLIGHT_PANIC, 9_000_000_000
        h.message = b"Kernel said so"
        h.text = b"VERSION 20070824\nPCIDEV 0028 123411e8 15 fea00000 0\n"
        self.hdr = h
        self.nmaps = 0
        self.next = [0] * cpus

    def map(self, virt: int, phys: int, size: int) -> None:
        self.nmaps += 1
        m = MmiotngFlightMap(self.nmaps, virt, phys, size)
        off = MAPS_OFF + (self.nmaps - 1) % MAPS * ctypes.sizeof(MmiotngFlightMap)
        self.data[off:off + ctypes.sizeof(m)] = bytes(m)

    def access(self, cpu: int, ts: int, phys: int, value: int, op: int = MMIOTNG_OP_WRITE,
               virt: int = 0xFFFFC90000100000, seq: int | None = None) -> None:
        self.next[cpu] += 1
        n = self.next[cpu]
        r = MmiotngFlightRec(seq=n if seq is None else seq, ts_ns=ts, map_virt=virt,
                             phys=phys, value=value, ip=0xFFFFFFFFC0001234, width=4, op=op)
        off = RECS_OFF + (cpu * self.recs + (n - 1) % self.recs) * RSIZE
        self.data[off:off + RSIZE] = bytes(r)

    def bytes(self) -> bytes:
        self.data[:HDR] = bytes(self.hdr)
        return bytes(self.data)


def text_of(image: bytes) -> list[str]:
    f = flight.parse(image)
    return (flight.header_text(f) + Renderer().feed_batch(list(flight.payloads(f)))).splitlines()


def test_memmap_reservations_are_found_but_ramoops_own():
    cmd = ("ro memmap=2M$0x60000000 memmap=0x100000$0x61000000,64K$0x62000000 "
           "memmap=1G@0x100000000 ramoops.mem_address=0x61000000")
    assert flight.reserved_regions(cmd) == [flight.Region(0x60000000, 2 << 20),
                                            flight.Region(0x62000000, 64 << 10)]
    assert flight.region(None, "memmap=4M$1536M") == flight.Region(1536 << 20, 4 << 20)
    assert flight.region("1M@0x70000000", cmd) == flight.Region(0x70000000, 1 << 20)


@pytest.mark.parametrize("spec, cmdline, says", [
    (None, "ro quiet", "has no memory"),
    (None, "memmap=1M$0x60000000 memmap=1M$0x70000000", "several memmap="),
    ("0x60000000", "", "expected SIZE@ADDR"),
    ("2Q@0x6", "", "expected SIZE@ADDR"),
])
def test_region_errors_say_what_to_do(spec, cmdline, says):
    with pytest.raises(UsageError, match=says):
        flight.region(spec, cmdline)


def test_one_cpu_wrapped_the_text_is_its_last_records_in_order():
    img = Image(cpus=2, recs=4)
    img.map(0xFFFFC90000100000, 0xFEA00000, 0x100000)
    for i in range(10):        # CPU 1 wraps: 6..9 stay
        img.access(1, 1_000_000_000 + i * 1000, 0xFEA00004, 0xF1000000 + i)
    lines = text_of(img.bytes())
    assert lines[:2] == ["VERSION 20070824", "PCIDEV 0028 123411e8 15 fea00000 0"]
    assert lines[2] == ("MARK 1.000006 mmiotrace-ng recover: 4 accesses kept, the last 4 of "
                        "each CPU; the machine: crashed")
    assert lines[3] == "MARK 1.000006 mmiotrace-ng recover: CPU 1"
    assert lines[4] == "MAP 1.000006 1 0xfea00000 0xffffc90000100000 0x100000 0x0 0"
    assert lines[5:9] == [f"W 4 1.00000{i} 1 0xfea00004 0x{0xF1000000 + i:x} 0x0 0"
                          for i in range(6, 10)]
    assert lines[9:] == ["MARK 9.000000 mmiotrace-ng recover: the machine died on CPU 1: "
                         "panic: Kernel said so"]


def test_cpus_merge_by_time_and_the_complete_point_is_said():
    img = Image(cpus=2, recs=3)
    img.map(0xFFFFC90000100000, 0xFEA00000, 0x100000)
    img.access(0, 1_000_000_000, 0xFEA00000, 1, op=MMIOTNG_OP_READ)     # CPU 0: complete
    for i in range(5):                                                  # CPU 1: 2 lost
        img.access(1, 1_000_010_000 + i * 10_000, 0xFEA00004, 100 + i)
    img.access(0, 1_000_035_000, 0xFEA00008, 2, op=MMIOTNG_OP_READ)
    lines = [ln for ln in text_of(img.bytes()) if not ln.startswith(("VERSION", "PCIDEV"))]
    body = [ln.split(" mmiotrace-ng recover: ")[-1] if ln.startswith("MARK") else ln
            for ln in lines]
    assert body[1:] == [
        "CPU 0",
        "MAP 1.000000 1 0xfea00000 0xffffc90000100000 0x100000 0x0 0",
        "R 4 1.000000 1 0xfea00000 0x1 0x0 0",
        "every CPU's accesses from here on (before, those of CPUs 1 were overwritten)",
        "CPU 1",
        "W 4 1.000030 1 0xfea00004 0x66 0x0 0",
        "CPU 0",
        "R 4 1.000035 1 0xfea00008 0x2 0x0 0",
        "CPU 1",
        "W 4 1.000040 1 0xfea00004 0x67 0x0 0",
        "W 4 1.000050 1 0xfea00004 0x68 0x0 0",
        "the machine died on CPU 1: panic: Kernel said so",
    ]


def test_torn_and_stale_slots_are_not_records():
    img = Image(cpus=1, recs=4, state=MMIOTNG_FLIGHT_STOPPED)
    img.map(0xFFFFC90000100000, 0xFEA00000, 0x100000)
    img.access(0, 1_000_000_000, 0xFEA00004, 1)
    img.access(0, 1_000_001_000, 0xFEA00004, 2, seq=0)      # cut short by the reset
    img.access(0, 1_000_002_000, 0xFEA00004, 3, seq=8)      # not the slot's number
    img.access(0, 1_000_003_000, 0xFEA00004, 4)
    f = flight.parse(img.bytes())
    assert [a.rec.value for a in f.accesses] == [1, 4]
    assert not f.crashed and f.state == "stopped"
    assert not any("died" in ln for ln in text_of(img.bytes()))


def test_a_region_without_records_is_refused():
    with pytest.raises(flight.FlightError, match="no flight recorder"):
        flight.parse(bytes(8192))
    img = Image()
    img.hdr.version = 99
    with pytest.raises(flight.FlightError, match="another layout"):
        flight.parse(img.bytes())


@pytest.mark.parametrize("reason, message, kind", [
    (MMIOTNG_FLIGHT_PANIC, "sysrq triggered crash\n", "sysrq-c"),
    (MMIOTNG_FLIGHT_PANIC, "Hard LOCKUP", "hard lockup"),
    (MMIOTNG_FLIGHT_PANIC, "softlockup: hung tasks", "soft lockup"),
    (MMIOTNG_FLIGHT_PANIC, "RCU Stall\n", "lockup (RCU stall)"),
    (MMIOTNG_FLIGHT_PANIC, "Fatal exception", "panic"),
    (MMIOTNG_FLIGHT_OOPS, "Oops at f+0x1/0x2", "oops"),
])
def test_the_kind_of_death_is_named(reason, message, kind):
    assert flight.classify(reason, message) == kind


class RegionHelper:
    """The helper's side of --flight: FLIGHT_READ serves an image (at most
    16 KiB a reply, as the helper does), FLIGHT_START is logged."""

    def __init__(self, image: bytes) -> None:
        self.image, self.read, self.started = image, 0, None

    def flight_read(self, phys: int, size: int, offset: int) -> bytes:
        chunk = self.image[offset:offset + 16384]
        self.read += len(chunk)
        return chunk

    def flight_start(self, phys: int, size: int, recs: int, text: str) -> None:
        self.started = (phys, size, recs)

    def status(self):
        return type("Status", (), {"flight_recs": 4096})()


def start_flight(image: bytes, capsys) -> RegionHelper:
    import argparse
    import io

    from mmiotrace_ng.tracer import session
    args = argparse.Namespace(compat=False, pc=False, pid=False, irq=False, dma=False,
                              flight=4096, flight_region=f"{len(image):#x}@0x60000000")
    s = session.Session(args, io.BytesIO())
    s.helper = helper = RegionHelper(image)
    s.start_flight("VERSION 20070824\n")
    return helper


def test_start_refuses_a_region_holding_a_crash_and_reads_its_header_only(capsys):
    img = Image(cpus=2, recs=4096)          # 2 x 4096 records: far more than a header
    with pytest.raises(UsageError, match=r"holds the records of a crash \(panic: Kernel said so"):
        start_flight(img.bytes(), capsys)
    img.hdr.state = MMIOTNG_FLIGHT_STOPPED
    helper = start_flight(img.bytes(), capsys)
    assert helper.started == (0x60000000, len(img.bytes()), 4096)
    assert HDR <= helper.read <= 16384 < len(img.bytes())
    assert "the last 4096 accesses of each CPU kept in" in capsys.readouterr().err
    # a region of anything else (no magic) is taken over
    assert start_flight(bytes(len(img.bytes())), capsys).started is not None
