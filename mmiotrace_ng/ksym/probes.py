"""The ksym BPF program on hardware-breakpoint perf events: one event per
watch and online CPU (CPUs that come online later get theirs when `refresh`
sees them), all held by this process's descriptors, so the breakpoints go
with the process however it ends."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

from ..common import bpfsys
from ..common.bpfload import (
    CACHE_DIR,
    LoaderError,
    compiled,
    create_maps,
    load_program,
    map_lookup,
    map_update,
    read_drops,
    source_dir,
)
from ..common.ringbuf import RingReader
from .records import NgKsymConfig, NgKsymKey, NgKsymWatch
from .request import Watch

BPF_PROG_TYPE_PERF_EVENT = 7
PERF_TYPE_BREAKPOINT = 5
HW_BREAKPOINT_W, HW_BREAKPOINT_RW = 2, 3
PERF_ATTR_SIZE = bpfsys.PERF_ATTR_SIZE
ONLINE = Path("/sys/devices/system/cpu/online")
PROGRAMS = ("on_hit",)

def online_cpus(text: str | None = None) -> set[int]:
    """The CPUs in /sys/devices/system/cpu/online ("0-3,5")."""
    return bpfsys.cpu_list(ONLINE.read_text() if text is None else text)


def breakpoint_attr(w: Watch) -> bytes:
    """struct perf_event_attr of a kernel data breakpoint, sampling every
    hit, created disabled (enabled once the program is attached)."""
    bp_type = HW_BREAKPOINT_RW if w.type == "RW" else HW_BREAKPOINT_W
    flags = 1                              # disabled
    attr = struct.pack("<IIQQQQQIIQQ", PERF_TYPE_BREAKPOINT, PERF_ATTR_SIZE, 0, 1, 0, 0,
                       flags, 0, bp_type, w.addr, w.len)
    return attr.ljust(PERF_ATTR_SIZE, b"\0")


class WatchError(LoaderError):
    """A breakpoint could not be set; the message says why."""


class KsymProbes:
    """The program, its maps and the breakpoint events of the watches."""

    def __init__(self, watches: list[Watch], histogram: bool, buffer_kb: int,
                 cache_dir: Path | None = CACHE_DIR) -> None:
        self.watches = watches
        self.fds: list[int] = []
        self.events: dict[int, list[int]] = {}      # cpu -> one event fd per watch
        self.gone = [0] * len(watches)              # counts of events closed since
        self.ring: RingReader | None = None
        pages = max(1, buffer_kb * 1024 // 4096)
        self.buffer_bytes = (1 << (pages - 1).bit_length()) * 4096
        obj, self.from_cache = compiled(source_dir("bpf") / "ksym.bpf.c", PROGRAMS, cache_dir)
        try:
            self.maps, by_old = create_maps(obj, {"hits": self.buffer_bytes}, self.fds)
            self._update("config", ctypes.c_int(NgKsymConfig.NG_KSYM_CONFIG_HISTOGRAM),
                         ctypes.c_uint32(int(histogram)))
            for slot, w in enumerate(watches):
                self._update("watches", ctypes.c_uint64(w.addr), NgKsymWatch(slot, w.len))
            self.prog = load_program(BPF_PROG_TYPE_PERF_EVENT, "on_hit", obj, by_old)
            self.fds.append(self.prog)
            self.ring = RingReader(self.maps["hits"], self.buffer_bytes)
            for cpu in sorted(online_cpus()):
                self._open_cpu(cpu)
        except BaseException:
            self.close()
            raise

    def _update(self, name: str, key: ctypes._CData, value: ctypes._CData) -> None:
        map_update(self.maps, name, key, value)

    def _open_cpu(self, cpu: int) -> None:
        fds: list[int] = []
        self.events[cpu] = fds
        for w in self.watches:
            try:
                fd = bpfsys.perf_event_open(breakpoint_attr(w), -1, cpu)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise WatchError(f"no free debug register on CPU {cpu} for {w.text} "
                                     "(perf, a debugger or another ksym holds them)") from None
                if exc.errno == errno.ENODEV:          # went offline just now
                    return
                raise WatchError(f"the kernel refused a breakpoint on {w.text} "
                                 f"(0x{w.addr:x}/{w.len}) on CPU {cpu}: {exc.strerror}") from None
            fds.append(fd)
            try:
                bpfsys.attach_perf_event(fd, self.prog)
            except OSError as exc:
                raise WatchError(f"cannot attach to the breakpoint on {w.text}: "
                                 f"{exc.strerror}") from None

    def refresh(self) -> list[int]:
        """Breakpoints on CPUs that came online since the last look (and
        none kept for those that went offline); the CPUs newly covered."""
        now = online_cpus()
        for cpu in set(self.events) - now:
            for slot, fd in enumerate(self.events.pop(cpu)):
                self.gone[slot] += struct.unpack("<Q", os.read(fd, 8))[0]
                os.close(fd)
        added = sorted(now - set(self.events))
        for cpu in added:
            self._open_cpu(cpu)
        return added

    def counts(self) -> list[int]:
        """Hits of each watch as the perf events counted them (every hit,
        whether or not its record found room)."""
        out = list(self.gone)
        for fds in self.events.values():
            for slot, fd in enumerate(fds):
                data = os.read(fd, 8)
                out[slot] += struct.unpack("<Q", data)[0]
        return out

    def histogram(self) -> tuple[dict[tuple[int, int], int], int]:
        """{(slot, ip): hits} from the map "hist", and the hits it had no
        room for."""
        out = {(k.slot, k.ip): v.value
               for k, v in bpfsys.map_items(self.maps["hist"], NgKsymKey, ctypes.c_uint64)}
        full = ctypes.c_uint64()
        map_lookup(self.maps, "hist_full", ctypes.c_int(0), full)
        return out, full.value

    def drops(self) -> tuple[int, int]:
        """(records dropped in all, dropped but not yet reported in a record)."""
        return read_drops(self.maps["drops"])

    def close(self) -> None:
        for fds in self.events.values():
            for fd in fds:
                os.close(fd)
        self.events = {}
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        for fd in reversed(self.fds):
            os.close(fd)
        self.fds = []
