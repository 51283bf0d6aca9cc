"""--histogram for MMIO tracing: the register-level summary of a run, from
counts the BPF program keeps per (register, instruction) instead of a
record per access.  A row per (access type, width, BAR offset, function),
most accesses first, with the value of the latest access."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_WRITE
from ..format.records import NgHistVal

OPS = {MMIOTNG_OP_READ: "R", MMIOTNG_OP_WRITE: "W"}


class Region(NamedTuple):
    """A traced range: a device's BAR (or ROM)."""

    device: str
    name: str          # "BAR0" .. "BAR5", "ROM"
    start: int
    end: int           # inclusive


def where(phys: int, regions: list[Region]) -> tuple[str, int]:
    for r in regions:
        if r.start <= phys <= r.end:
            return f"{r.device} {r.name}", phys - r.start
    return "?", phys


def function_name(text: str) -> str:
    """`name [module]` of a `name+0xoff/0xsize [module]`."""
    name = text.split("+", 1)[0]
    return name + (text[text.rindex(" ["):] if text.endswith("]") else "")


def rows(counts: dict[tuple[int, int, int, int], NgHistVal], regions: list[Region],
         function: Callable[[int], str]) -> list[tuple[str, int, str, int, str, int, int]]:
    """(type, width, region, offset, function, count, last value), summed
    over the places within one function, most accesses first."""
    acc: dict[tuple[str, int, str, int, str], list[int]] = {}
    for (phys, ip, op, width), v in counts.items():
        region, off = where(phys, regions)
        key = (OPS.get(op, "?"), width, region, off, function_name(function(ip)))
        cur = acc.setdefault(key, [0, 0, -1])
        cur[0] += v.count
        if v.last_ns > cur[2]:
            cur[1], cur[2] = v.last, v.last_ns
    out = [(*k, c, last) for k, (c, last, _ns) in acc.items()]
    out.sort(key=lambda r: (-r[5], r[2], r[3], r[0], r[4]))
    return out


def table(counts: dict[tuple[int, int, int, int], NgHistVal], regions: list[Region],
          function: Callable[[int], str], not_counted: int = 0) -> str:
    lines = [f"{'Type':<4s} {'Width':<5s} {'Region':<20s} {'Offset':<10s} {'Function':<40s} "
             f"{'Count':>10s} Last\n"]
    for typ, width, region, off, fn, count, last in rows(counts, regions, function):
        lines.append(f"{typ:<4s} {width:<5d} {region:<20s} {f'0x{off:x}':<10s} {fn:<40s} "
                     f"{count:>10d} 0x{last:x}\n")
    if not_counted:
        lines.append(f"# {not_counted} accesses not counted: the histogram map was full\n")
    return "".join(lines)
