"""`mmiotrace-ng plot FILE -o OUT.png`: a trace's registers against time.

One row per register (its name where a register map names it: --regs,
default the shipped maps; else its offset), sorted by address, the lowest
at the top; time in seconds (the trace's own clock) across.  A read is a
blue mark in the upper half of its row, a write a red one in the lower
half, an UNKNOWN access a grey one between; MARK lines are labelled dashed
verticals.  Two things keep a driver's start-up on one readable page: a
run of MERGE_RUN or more neighbouring rows with the same marks (a table
cleared in one go) is one row labelled with the range, and stretches
without any access or MARK longer than GAP of the whole are cut out (the
axis breaks, //; --linear keeps time to scale).

A trace of any length is read once, in bounded memory: each row keeps one
byte per time bin (which kinds of access fell in it), at most BIN_FACTOR
bins per pixel column; when the times seen no longer fit, the bins are
merged in pairs (the bin width doubles).  Likewise past MAX_ROWS distinct
addresses, neighbouring addresses share a row (the address granularity
doubles), so a trace of a frame buffer plots as address ranges.

matplotlib (and numpy, which it needs) is imported only here, in run(),
after the trace was found readable: the distribution's package (Debian,
Ubuntu: python3-matplotlib), or `pip install 'mmiotrace-ng[plot]'`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Final

from ..common.errors import UsageError
from .accesses import (
    Event,
    Namer,
    events,
    feed_pcidev,
    note_unapplied,
    open_trace,
    register_namer,
    valid_text,
)

if TYPE_CHECKING:
    import numpy as np

READ: Final = 1
WRITE: Final = 2
UNKNOWN: Final = 4
FLAGS: Final = {"R": READ, "W": WRITE, "UNKNOWN": UNKNOWN}
COLOURS: Final = {READ: "#1f60c4", WRITE: "#d62728", UNKNOWN: "#8c8c8c"}
LABELS: Final = {READ: "read", WRITE: "write", UNKNOWN: "UNKNOWN"}
OFFSETS: Final = {READ: -0.22, WRITE: 0.22, UNKNOWN: 0.0}     # in rows (y grows down)
WIDTH: Final = 1600             # pixels, by default
DPI: Final = 100
BIN_FACTOR: Final = 2           # time bins per pixel column, at least 1 after merging
MAX_ROWS: Final = 1024
MERGE_RUN: Final = 4           # neighbouring rows alike: one row from this many on
GAP: Final = 0.05               # idle stretches longer than this share of the time: cut
MAX_SEGMENTS: Final = 6
MAX_MARKS: Final = 200          # labelled; more are counted in the title
BATCH: Final = 65536            # accesses binned at a time
MISSING: Final = ("plot needs matplotlib: install the distribution's package (Debian, "
                   "Ubuntu: apt install python3-matplotlib) or pip install "
                   "'mmiotrace-ng[plot]'")


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not WIDTHxHEIGHT: {text!r}") from None
    if not (100 <= w <= 20000 and 100 <= h <= 20000):
        raise argparse.ArgumentTypeError("width and height: 100 to 20000 pixels")
    return w, h


def setup(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("file", metavar="FILE",
                    help="a trace: text (20070824) or recorded; - for standard input")
    ap.add_argument("-o", "--output", metavar="OUT.png", required=True,
                    help="the PNG to write (- for standard output)")
    ap.add_argument("--regs", action="append", default=[], metavar="MAP",
                    help="register map: a .regs file or the name of a shipped one (e1000, "
                         "edu); repeatable; default: every shipped map, each where its "
                         "device is in the trace")
    ap.add_argument("--start", type=float, metavar="S",
                    help="from this time on (seconds, the trace's clock)")
    ap.add_argument("--end", type=float, metavar="S", help="up to this time (seconds)")
    ap.add_argument("--linear", action="store_true",
                    help="time to scale throughout: do not cut out long idle stretches")
    ap.add_argument("--no-merge", action="store_true",
                    help=f"one row per register always (default: {MERGE_RUN} or more "
                         "neighbouring registers with the same marks share a row)")
    ap.add_argument("--size", type=_size, metavar="WxH",
                    help=f"the picture's size in pixels (default {WIDTH} wide, the height "
                         "from the number of registers)")


def run(args: argparse.Namespace) -> int:
    if args.start is not None and args.end is not None and args.start >= args.end:
        raise UsageError("--start must be before --end")
    trace = open_trace(args.file)
    try:
        import matplotlib
        import numpy  # noqa: F401
    except ImportError:
        raise UsageError(MISSING) from None
    matplotlib.use("Agg")
    namer = register_namer(args.regs)
    width = args.size[0] if args.size else WIDTH
    binner = Binner(width * BIN_FACTOR, namer,
                    None if args.start is None else round(args.start * 1e9),
                    None if args.end is None else round(args.end * 1e9))
    for ev in events(trace):
        binner.feed(ev)
    binner.flush()
    note_unapplied(namer, args.regs, "plot")
    fig = draw(binner, valid_text(os.path.basename(trace.name)), args.size, args.linear,
               merge=not args.no_merge)
    try:
        if args.output == "-":
            sys.stdout.flush()
            fig.savefig(sys.stdout.buffer, format="png")
            sys.stdout.buffer.flush()
        else:
            fig.savefig(args.output, format="png")
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror}") from exc
    return 0


class Binner:
    """Which kinds of access fell in each (row, time bin), in bounded memory."""

    def __init__(self, nbins: int, namer: Namer | None = None, start_ns: int | None = None,
                 end_ns: int | None = None) -> None:
        import numpy as np

        self.np = np
        self.nbins = nbins
        self.namer = namer
        self.start_ns, self.end_ns = start_ns, end_ns
        self.width_ns = 1000            # of a bin; a power of two times 1 us
        if start_ns is not None and end_ns is not None:
            while (end_ns - start_ns) // self.width_ns >= nbins:
                self.width_ns *= 2
        self.lo: int | None = None      # the first bin's number (time // width_ns)
        self.grid: np.ndarray = np.zeros((16, nbins), np.uint8)
        self.rows: dict[Any, int] = {}  # key -> row of grid
        self.first: dict[Any, tuple[int, int, str | None]] = {}   # key -> (phys, base, name)
        self.shift = 0                  # address bits one row spans
        self.bases: dict[int, int] = {}     # map id -> its phys
        self.counts = dict.fromkeys(FLAGS, 0)
        self.marks: list[tuple[int, str]] = []
        self.nmarks = 0
        self.t_min: int | None = None
        self.t_max: int | None = None
        self._ts: list[int] = []
        self._row: list[int] = []
        self._flag: list[int] = []

    def feed(self, ev: Event) -> None:
        kind = ev.kind
        if kind == "PCIDEV":
            feed_pcidev(self.namer, ev.text)
        elif kind == "MAP":
            self.bases[ev.map_id] = ev.phys
        ts = ev.ts_ns
        if kind not in FLAGS and kind != "MARK":
            return
        if (self.start_ns is not None and ts < self.start_ns) or (
                self.end_ns is not None and ts > self.end_ns):
            return
        if kind == "MARK":
            self.nmarks += 1
            if len(self.marks) < MAX_MARKS:
                self.marks.append((ts, valid_text(ev.text)))
            return
        self.counts[kind] += 1
        row = self._row_of(ev)      # first: it may flush what is held
        self._ts.append(ts)
        self._row.append(row)
        self._flag.append(FLAGS[kind])
        if len(self._ts) >= BATCH:
            self.flush()

    def _row_of(self, ev: Event) -> int:
        name = self.namer(ev.phys) if self.namer is not None else None
        key: Any = ("n", name) if name else ("a", ev.phys >> self.shift)
        row = self.rows.get(key)
        if row is None:
            if key[0] == "a" and len(self.rows) >= MAX_ROWS:
                self.flush()
                while len(self.rows) >= MAX_ROWS // 2 and sum(
                        k[0] == "a" for k in self.rows) > 1:
                    self._coarser_rows()
                key = ("a", ev.phys >> self.shift)
                row = self.rows.get(key)
                if row is not None:
                    return row
            row = len(self.rows)
            if row == len(self.grid):
                self.grid = self.np.concatenate([self.grid, self.np.zeros_like(self.grid)])
            self.rows[key] = row
            self.first[key] = (ev.phys, self.bases.get(ev.map_id, -1), name)
        return row

    def _coarser_rows(self) -> None:
        """Neighbouring addresses in one row: twice as many per row as before."""
        np = self.np
        self.shift += 1
        old = sorted(self.rows.items(), key=lambda kv: kv[1])
        rows: dict[Any, int] = {}
        first: dict[Any, tuple[int, int, str | None]] = {}
        where = []
        for key, _row in old:
            new = ("a", key[1] >> 1) if key[0] == "a" else key
            if new not in rows:
                rows[new] = len(rows)
                first[new] = self.first[key]
            else:
                first[new] = min(first[new], self.first[key])
            where.append(rows[new])
        grid = np.zeros((max(16, len(rows)), self.nbins), np.uint8)
        np.bitwise_or.at(grid, np.array(where, np.intp), self.grid[: len(old)])
        self.rows, self.first, self.grid = rows, first, grid

    def flush(self) -> None:
        """Put the accesses held into the grid."""
        if not self._ts:
            return
        np = self.np
        ts = np.array(self._ts, np.int64)
        rows = np.array(self._row, np.intp)
        flags = np.array(self._flag, np.uint8)
        self._ts, self._row, self._flag = [], [], []
        lo, hi = int(ts.min()), int(ts.max())
        self.t_min = lo if self.t_min is None else min(self.t_min, lo)
        self.t_max = hi if self.t_max is None else max(self.t_max, hi)
        self._make_room(lo // self.width_ns, hi // self.width_ns)
        assert self.lo is not None
        cols = ts // self.width_ns - self.lo
        np.bitwise_or.at(self.grid, (rows, cols), flags)

    def _make_room(self, first: int, last: int) -> None:
        """Bins for the bin numbers first..last: wider bins, or the window
        moved, as needed."""
        np = self.np
        if self.lo is None:
            if self.start_ns is not None:
                first = min(first, self.start_ns // self.width_ns)
            while last - first >= self.nbins:
                self.width_ns *= 2
                first, last = first // 2, last // 2
            self.lo = first
            return
        if self.lo <= first and last < self.lo + self.nbins:
            return
        used = np.nonzero(self.grid.any(axis=0))[0]
        lo = min(first, self.lo + int(used[0])) if len(used) else first
        hi = max(last, self.lo + int(used[-1])) if len(used) else last
        k = 0
        while (hi >> k) - (lo >> k) >= self.nbins:
            k += 1
        grid = np.zeros_like(self.grid)
        if len(used):
            old = self.lo + used              # bin numbers in use
            np.bitwise_or.at(grid, (slice(None), (old >> k) - (lo >> k)), self.grid[:, used])
        self.grid, self.lo, self.width_ns = grid, lo >> k, self.width_ns << k

    def bin_ns(self, col: int) -> int:
        """The start of the grid's column col, in ns."""
        assert self.lo is not None
        return (self.lo + col) * self.width_ns


def rows(b: Binner, merge: bool = True) -> tuple[list[str], np.ndarray, str]:
    """The rows to draw, top to bottom: their labels, their bins and the y
    axis' title.  Rows in address order; unless not merge, runs of at least
    MERGE_RUN neighbouring address rows with the same marks at this
    resolution (a table written in one go, say) are one row labelled with
    the range."""
    np = b.np
    keys = sorted(b.rows, key=lambda k: (b.first[k][0], str(k[1])))
    grid = b.grid[np.array([b.rows[k] for k in keys], np.intp)] if keys else b.grid[:0]
    bases = {b.first[k][1] for k in keys if k[0] == "a" and b.first[k][1] >= 0}
    named = sum(k[0] == "n" for k in keys)

    def where(k: Any, last: bool = False) -> str:
        """Its name, else its address (its offset in its mapping); last: the
        last address of the row, not the first."""
        phys, base, name = b.first[k]
        if k[0] == "n":
            return str(name)
        addr = (k[1] << b.shift) + (((1 << b.shift) - 1) if last else 0)
        if base < 0:
            return f"0x{addr:x}"
        return ("" if len(bases) == 1 or last else f"{base:x}") + f"+0x{addr - base:04x}"

    labels: list[str] = []
    keep: list[int] = []
    i = 0
    while i < len(keys):
        j = i + 1
        while (j < len(keys) and b.first[keys[j]][1] == b.first[keys[i]][1]
               and np.array_equal(grid[j], grid[i])):
            j += 1
        if j - i < MERGE_RUN or not merge:
            j = i + 1
        if j - i > 1:
            labels.append(f"{where(keys[i])}..{where(keys[j - 1], True)} ({j - i})")
        elif b.shift and keys[i][0] == "a":
            labels.append(f"{where(keys[i])}..{where(keys[i], True)}")
        else:
            labels.append(where(keys[i]))
        keep.append(i)
        i = j
    if len(bases) == 1:
        title = f"offset in the mapping of 0x{next(iter(bases)):x}"
    else:
        title = "address"
    if named == len(keys) and keys:
        title = "register"
    elif named:
        title = f"register, or {title}"
    return labels, grid[np.array(keep, np.intp)] if keep else grid, title


def segments(b: Binner, grid: np.ndarray, linear: bool) -> list[tuple[int, int]]:
    """The stretches of time to draw (ns): the whole range, or, unless
    linear, the range less each idle stretch (no access, no MARK) longer
    than GAP of it (at most MAX_SEGMENTS stretches, the longest gaps cut)."""
    np = b.np
    times = [ts for ts, _ in b.marks]
    if b.t_min is not None and b.t_max is not None:
        times += [b.t_min, b.t_max]
    if not times:
        return []
    lo = b.start_ns if b.start_ns is not None else min(times)
    hi = b.end_ns if b.end_ns is not None else max(times)
    if linear or b.lo is None or b.start_ns is not None or b.end_ns is not None:
        return [(lo, hi)]
    busy = grid.any(axis=0)
    for ts in times:
        col = ts // b.width_ns - b.lo
        if 0 <= col < len(busy):
            busy[col] = True
    used = np.nonzero(busy)[0]
    gaps = np.diff(used) - 1                 # idle bins after each used one
    big = np.nonzero(gaps > GAP * (used[-1] - used[0] + 1))[0]
    big = sorted(big, key=lambda i: -gaps[i])[: MAX_SEGMENTS - 1]
    out = []
    start = lo
    for i in sorted(big):
        out.append((start, b.bin_ns(int(used[i]) + 1)))
        start = b.bin_ns(int(used[i + 1]))
    out.append((start, hi))
    return out


LABEL_GAP: Final = 6            # pixels at least between two time labels


def _thin_time_labels(fig: Any, axes: Any) -> None:
    """Leave out the time labels that would overlap the one before, left to
    right across the segments (a narrow segment, between two cut idle
    stretches, has room for few): the figure is laid out once to measure
    them, and each axis keeps the ticks whose labels fit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.ticker import FixedLocator

    canvas = FigureCanvasAgg(fig)
    for _ in range(2):      # fewer ticks may be labelled with more digits: again
        canvas.draw()
        renderer = canvas.get_renderer()
        right = -float("inf")
        changed = False
        for ax in axes:
            lo, hi = sorted(ax.get_xlim())
            keep = []
            for tick, label in zip(ax.get_xticks(), ax.get_xticklabels(), strict=True):
                if not lo <= tick <= hi or not label.get_text():
                    continue
                box = label.get_window_extent(renderer)
                if box.x0 >= right + LABEL_GAP:
                    keep.append(tick)
                    right = box.x1
                else:
                    changed = True
            ax.xaxis.set_major_locator(FixedLocator(keep))
        if not changed:
            return


def draw(b: Binner, title: str, size: tuple[int, int] | None = None,
         linear: bool = False, merge: bool = True):  # -> matplotlib.figure.Figure
    """The picture of what b holds (merge: see rows)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    np = b.np
    labels, grid, ytitle = rows(b, merge)
    nrows = len(labels)
    w, h = size or (WIDTH, max(480, min(4000, 170 + 11 * nrows)))
    fig = Figure(figsize=(w / DPI, h / DPI), dpi=DPI, layout="constrained")
    spans = segments(b, grid, linear) or [(0, 1)]
    total = sum(hi - lo for lo, hi in spans) or 1
    ratios = [max(hi - lo, total * 0.04) for lo, hi in spans]
    axes = fig.subplots(1, len(spans), sharey=True, squeeze=False,
                        gridspec_kw={"width_ratios": ratios, "wspace": 0.015})[0]
    n = b.counts
    text = (f"{title}: {n['R']:,} reads, {n['W']:,} writes"
            + (f", {n['UNKNOWN']:,} UNKNOWN" if n["UNKNOWN"] else "")
            + f" of {len(b.rows):,} " + ("address ranges" if b.shift else "registers")
            + (f", {b.nmarks:,} MARK" + "s" * (b.nmarks > 1) if b.nmarks else "")
            + ("" if len(spans) == 1 else "; idle stretches cut out (//): " + str(len(spans) - 1)))
    axes[0].set_title(text, loc="left", fontsize=10, parse_math=False)
    fig.supxlabel("time (s)", fontsize=10)
    axes[0].set_ylabel(ytitle)
    row_px = max(h * 0.85 / max(nrows, 1), 1.0)
    points = {}
    for flag in (UNKNOWN, READ, WRITE):
        r, c = np.nonzero(grid & flag)
        if len(r):
            points[flag] = ((b.bin_ns(0) + (c + 0.5) * b.width_ns) / 1e9, r + OFFSETS[flag])
    length = max(2.0, row_px * 0.42) * 72 / DPI              # points
    lw = max(1.0, min(3.0, w / 1000))
    for k, (ax, (lo, hi)) in enumerate(zip(axes, spans, strict=True)):
        for flag, (x, y) in points.items():
            inside = (x >= lo / 1e9 - 1e-9) & (x <= hi / 1e9 + 1e-9)
            if inside.any():
                ax.scatter(x[inside], y[inside], s=length ** 2, marker="|", c=COLOURS[flag],
                           linewidths=lw, antialiased=False, zorder=2)
        pad = max((hi - lo) * 0.01, b.width_ns)
        ax.set_xlim((lo - pad) / 1e9, (hi + pad) / 1e9)
        ax.xaxis.set_major_formatter(ScalarFormatter(useOffset=False))
        ax.xaxis.set_major_locator(MaxNLocator(max(2, int(12 * ratios[k] / sum(ratios)))))
        ax.grid(axis="x", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
        tr = ax.get_xaxis_transform()
        for ts, label in b.marks:
            if lo <= ts <= hi:      # under the data: a label hides no access
                ax.axvline(ts / 1e9, color="0.35", lw=0.9, ls="--", zorder=1)
                ax.text(ts / 1e9, 0.995, label if len(label) <= 60 else label[:59] + "\u2026",
                        transform=tr, rotation=90, va="top", ha="right", fontsize=7,
                        color="0.2", zorder=1, parse_math=False)
        if k:
            ax.spines["left"].set_visible(False)
            ax.tick_params(left=False)
        if k < len(spans) - 1:
            ax.spines["right"].set_visible(False)
            for y in (0, 1):        # the break: // on the axis lines
                ax.plot([1], [y], transform=ax.transAxes, marker=[(-1, -2), (1, 2)],
                        markersize=8, ls="", color="k", mew=1, clip_on=False)
    if nrows:
        step = max(1, int(np.ceil(9 / row_px)))       # a label every 9 pixels at least
        axes[0].set_yticks(range(0, nrows, step), labels[::step],
                           fontsize=min(8, max(5, row_px * step * 0.7 * 72 / DPI)))
        axes[0].set_ylim(nrows - 0.5, -0.5)
    else:
        axes[0].text(0.5, 0.5, "no accesses", transform=axes[0].transAxes, ha="center",
                     va="center")
        axes[0].set_yticks([])
    _thin_time_labels(fig, axes)
    handles = [Line2D([], [], color=COLOURS[f], marker="|", ls="", markersize=9,
                      markeredgewidth=2, label=LABELS[f])
               for kind, f in FLAGS.items() if n[kind]]
    if handles:
        axes[-1].legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                        ncol=3, frameon=False, borderaxespad=0.2, fontsize=9,
                        handletextpad=0.2)
    return fig
