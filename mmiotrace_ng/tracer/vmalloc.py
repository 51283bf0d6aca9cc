"""The ioremap mappings that exist before tracing starts, from /proc/vmallocinfo.

The tracer arms them (unless --no-existing or --all) so that a driver bound
before the start is traced too: each line of vmallocinfo an ioremap made
holds its virtual range, its size (with one guard page) and phys=.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class Existing(NamedTuple):
    """An ioremap area of a traced range: virtual start, size (no guard page,
    at most to the end of the range) and physical start."""

    virt: int
    size: int
    phys: int


KPTR_RESTRICT = Path("/proc/sys/kernel/kptr_restrict")


def read_vmallocinfo() -> str:
    """/proc/vmallocinfo with real addresses: with kptr_restrict 0 the kernel
    prints hashed ones, so it is set to 1 (root still sees them) meanwhile;
    2 (zeros even for root) is left alone and said by the caller."""
    try:
        saved = KPTR_RESTRICT.read_text().strip()
    except OSError:
        saved = None
    if saved == "0":
        KPTR_RESTRICT.write_text("1")
    try:
        return Path("/proc/vmallocinfo").read_text()
    finally:
        if saved == "0":
            KPTR_RESTRICT.write_text(saved)


def existing_mappings(ranges: list[tuple[int, int]], vmallocinfo: str) -> list[Existing]:
    """ioremap areas of the traced ranges in vmallocinfo's text."""
    found = []
    for line in vmallocinfo.splitlines():
        fields = line.split()
        if "ioremap" not in fields or "[mmiotng]" in fields:   # not the helper's own
            continue
        phys = next((int(f[5:], 16) for f in fields if f.startswith("phys=")), None)
        if phys is None:
            continue
        virt, size = int(fields[0].partition("-")[0], 16), int(fields[1]) - 4096  # less guard
        for lo, hi in ranges:
            if lo <= phys < hi:
                found.append(Existing(virt, min(size, hi - phys), phys))
    return found
