"""What ksym prints: a line per hit in the ksym_tracer proposal's layout,
and the histogram table (counts per access type, symbol and function)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .records import NgKsymHit
from .request import Watch


@dataclass(frozen=True)
class Options:
    timestamps: bool = False
    value: bool = False


def header(opts: Options) -> str:
    cols = ["# TASK-PID", "CPU#"]
    if opts.timestamps:
        cols.append("TIMESTAMP")
    cols += ["Symbol", "Type"]
    if opts.value:
        cols.append("Value")
    cols.append("Function")
    return " ".join(cols) + "\n"


def value_of(hit: NgKsymHit, w: Watch) -> int:
    return hit.value & ((1 << (8 * w.len)) - 1)


def hit_line(hit: NgKsymHit, w: Watch, function: Callable[[int], str],
             opts: Options) -> str:
    comm = hit.comm.decode(errors="replace")
    parts = [f"{comm:<15s} {hit.pid:<5d} {hit.cpu:<3d}"]
    if opts.timestamps:
        secs, ns = divmod(hit.ts_ns, 1_000_000_000)
        parts.append(f"{secs}.{ns // 1000:06d}")
    parts.append(f"{w.text:<20s} {w.type}")
    if opts.value:
        parts.append(f"0x{value_of(hit, w):x}")
    parts.append(function(hit.ip))
    return " ".join(parts) + "\n"


def lost_line(n: int) -> str:
    return f"# lost {n} hits\n"


def histogram_table(counts: dict[tuple[int, int], int], watches: list[Watch],
                    function: Callable[[int], str]) -> str:
    """`Access_Type Symbol_name Function Counter`, a row per (watch,
    function), most hits first.  Places within one function add up."""
    rows: dict[tuple[int, str], int] = {}
    for (slot, ip), n in counts.items():
        where = function(ip)
        name = where.split("+", 1)[0]
        mod = where[where.rindex(" [") + 1:] if where.endswith("]") else ""
        key = (slot, f"{name} {mod}".strip())
        rows[key] = rows.get(key, 0) + n
    lines = [f"{'Access_Type':<11s} {'Symbol_name':<20s} {'Function':<40s} Counter\n"]
    for (slot, fn), n in sorted(rows.items(), key=lambda kv: (-kv[1], kv[0])):
        w = watches[slot]
        lines.append(f"{w.type:<11s} {w.text:<20s} {fn:<40s} {n}\n")
    return "".join(lines)
