"""Traced ranges that processes had mapped before the start.

A mapping a driver makes into a process while tracing (remap_pfn_range:
a sysfs resourceN file's mmap, a driver's own mmap) is said by the BPF
probe on remap_pfn_range. Those made before the start are found here, for
the kind /proc/PID/maps names: a PCI device's sysfs resourceN (or
resourceN_wc) file. Each gets the same NOT-traced record the probe makes
(err -NG_ERR_USER_MAP): accesses from user space are not traced.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from ..format.records import NG_ERR_USER_MAP, NgRecType, NgRecUntraced
from .pci import PciError, resources

# start-end perms offset dev inode path (the path a sysfs resource file's)
MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ ([0-9a-f]+) \S+ \d+ +"
                       r"(/sys/devices/\S+)/resource(\d)(?:_wc)?$", re.MULTILINE)


def bar_range(device_dir: str, index: int) -> tuple[int, int] | None:
    """[start, end] of BAR index of the device at this sysfs directory
    (None if unknown)."""
    try:
        start, end, _ = resources(Path(device_dir))[index]
    except (OSError, IndexError, PciError):     # gone, or not a device's
        return None
    return start, end


def bar_offset_to_phys(bar: tuple[int, int], offset: int) -> int:
    """The physical address a resource file's mapping at this file offset
    (as /proc/PID/maps shows it) starts at: the kernel's PCI mmap moves
    the mapping's offset to the BAR's physical page, so a mapping made by
    it shows its physical address; one that does not, its offset into
    the BAR."""
    start, end = bar
    return offset if start <= offset <= end else start + offset


def find(ranges: list[tuple[int, int]], proc: str = "/proc",
         root: str = "/") -> list[tuple[int, int, int, int]]:
    """(pid, user address, physical address, size) of each mapping of a
    sysfs resource file that overlaps one of ranges ([lo, hi)), in the
    processes now (root: where the paths /proc shows are, for tests)."""
    found = []
    bars: dict[tuple[str, int], tuple[int, int] | None] = {}
    for pid in sorted(int(p) for p in os.listdir(proc) if p.isdigit()):
        try:
            # any bytes: a mapped file's name is the process's to choose
            text = Path(proc, str(pid), "maps").read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            continue    # gone meanwhile, or not readable
        for m in MAPS_LINE.finditer(text):
            key = (os.path.join(root, m[4].lstrip("/")), int(m[5]))
            if key not in bars:
                bars[key] = bar_range(*key)
            bar = bars[key]
            if bar is None:
                continue
            virt, end = int(m[1], 16), int(m[2], 16)
            phys = bar_offset_to_phys(bar, int(m[3], 16))
            size = end - virt
            if any(phys < hi and lo < phys + size for lo, hi in ranges):
                found.append((pid, virt, phys, size))
    return found


def records(found: Iterable[tuple[int, int, int, int]]) -> list[bytes]:
    """The NOT-traced records of these mappings, stamped now (the clock of
    the BPF programs' stamps)."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    out = []
    for pid, virt, phys, size in found:
        rec = NgRecUntraced(phys=phys, virt=virt, len=size, err=-NG_ERR_USER_MAP, pid=pid)
        rec.hdr.ts_ns = now
        rec.hdr.type = NgRecType.NG_REC_UNTRACED
        out.append(bytes(rec))
    return out
