"""plot: register against time as a PNG.

The traces are built here so that where the marks must be is known: one
register only read early, another only written late; the picture is read
back and the two colours looked for where they belong.  The binning that
bounds the memory is checked on its own: bins and rows merge, and every
access still lands in the bin and row of its time and address."""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import pytest
from ng_require import missing

from mmiotrace_ng.analysis import plot
from mmiotrace_ng.analysis.accesses import Event
from mmiotrace_ng.common.errors import EXIT_USAGE, UsageError
from mmiotrace_ng.format import rawfile
from mmiotrace_ng.format.records import NgRecAccess, NgRecType

PCIDEV = "PCIDEV 0030 1234abcd 16 feb40000 0 0 0 0 0 0 20000 0 0 0 0 0 0 testdrv\n"
BASE = 0xFEB40000


@pytest.fixture
def mpl():
    try:
        import matplotlib.image
    except ImportError:
        missing("matplotlib is not installed (python3-matplotlib, or pip install "
                "'mmiotrace-ng[plot]')")
    return matplotlib.image


def t(us: int) -> str:
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def write_trace(path: Path, lines: list[str]) -> str:
    path.write_text("VERSION 20070824\n" + PCIDEV
                    + f"MAP {t(900_000)} 1 0x{BASE:x} 0xffffc90000100000 0x20000 0x0 0\n"
                    + "".join(lines))
    return str(path)


def early_reads_late_writes(path: Path) -> str:
    """+0x0000 read every ms from 1 s to 2 s, +0x0100 written from 2 s to 3 s,
    a MARK at 2.5 s."""
    lines = [f"R 4 {t(us)} 1 0x{BASE:x} 0x1 0x0 0\n" for us in range(1_000_000, 2_000_000, 1000)]
    lines += [f"W 4 {t(us)} 1 0x{BASE + 0x100:x} 0x2 0x0 0\n"
              for us in range(2_000_000, 3_000_000, 1000)]
    lines.insert(1500, f"MARK {t(2_500_000)} half way\n")
    return write_trace(path, lines)


def binned(src: str, nbins: int) -> plot.Binner:
    """A Binner fed the whole trace in src."""
    from mmiotrace_ng.analysis.accesses import events, open_trace

    b = plot.Binner(nbins)
    for ev in events(open_trace(src)):
        b.feed(ev)
    b.flush()
    return b


def run_plot(argv: list[str]) -> int:
    """The subcommand as cli.main runs it (UsageError: exit status 2)."""
    ap = argparse.ArgumentParser(prog="mmiotrace-ng plot")
    plot.setup(ap)
    try:
        return plot.run(ap.parse_args(argv))
    except UsageError as exc:
        print(f"mmiotrace-ng: {exc}", file=sys.stderr)
        return EXIT_USAGE


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def pixels_of(img, colour: str):
    """(x, y) of the pixels that have exactly this colour."""
    import numpy as np

    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
    ys, xs = np.nonzero(np.all(np.abs(img[:, :, :3] - rgb) < 1.5 / 255, axis=2))
    return xs, ys


def test_png_of_the_requested_size_with_both_colours(tmp_path, mpl):
    import numpy as np

    src = early_reads_late_writes(tmp_path / "t.txt")
    out = tmp_path / "t.png"
    assert run_plot([src, "-o", str(out), "--size", "900x420"]) == 0
    assert png_size(out) == (900, 420)
    img = mpl.imread(str(out))
    assert img.shape[:2] == (420, 900)
    rx, ry = pixels_of(img, plot.COLOURS[plot.READ])
    wx, wy = pixels_of(img, plot.COLOURS[plot.WRITE])
    assert len(rx) > 200 and len(wx) > 200
    # reads early (left), writes late (right); +0x0000 above +0x0100; the
    # legend's two marks are the only exceptions
    assert np.percentile(rx, 95) < np.percentile(wx, 5)
    assert np.percentile(ry, 95) < np.percentile(wy, 5)
    # a second apart in a 2 s trace: the reads span about half the width
    assert 0.3 < (np.percentile(rx, 99) - np.percentile(rx, 1)) / 900 < 0.6


def test_reads_above_writes_in_a_row(tmp_path, mpl):
    import numpy as np

    lines = [f"{'RW'[k % 2]} 4 {t(1_000_000 + 500 * k)} 1 0x{BASE:x} 0x1 0x0 0\n"
             for k in range(2000)]
    out = tmp_path / "t.png"
    assert run_plot([write_trace(tmp_path / "t.txt", lines), "-o", str(out)]) == 0
    img = mpl.imread(str(out))
    rx, ry = pixels_of(img, plot.COLOURS[plot.READ])
    wx, wy = pixels_of(img, plot.COLOURS[plot.WRITE])
    assert np.median(ry) < np.median(wy) and abs(np.median(rx) - np.median(wx)) < 20


def test_the_figure_has_the_rows_and_marks(tmp_path, mpl):
    """What draw() puts in: rows by address, the MARK as a labelled line,
    counts in the title."""
    binner = plot.Binner(1000)
    from mmiotrace_ng.analysis.accesses import events, open_trace

    for ev in events(open_trace(early_reads_late_writes(tmp_path / "t.txt"))):
        binner.feed(ev)
    binner.flush()
    fig = plot.draw(binner, "t.txt")
    (ax,) = fig.axes
    assert [tl.get_text() for tl in ax.get_yticklabels()] == ["+0x0000", "+0x0100"]
    assert ax.get_title(loc="left") == "t.txt: 1,000 reads, 1,000 writes of 2 registers, 1 MARK"
    assert "half way" in [tx.get_text() for tx in ax.texts]
    vertical = [ln.get_xdata()[0] for ln in ax.lines if len(set(ln.get_xdata())) == 1]
    assert 2.5 in vertical
    lo, hi = ax.get_xlim()
    assert lo < 1.0 and 2.999 < hi < 3.1


def test_idle_stretches_are_cut_out(tmp_path, mpl):
    lines = [f"R 4 {t(us)} 1 0x{BASE:x} 0x1 0x0 0\n" for us in range(1_000_000, 1_100_000, 100)]
    lines += [f"W 4 {t(us)} 1 0x{BASE:x} 0x1 0x0 0\n" for us in range(9_000_000, 9_100_000, 100)]
    src = write_trace(tmp_path / "t.txt", lines)
    b = binned(src, 1000)
    fig = plot.draw(b, "t")
    assert len(fig.axes) == 2
    (a_lo, a_hi), (b_lo, b_hi) = (ax.get_xlim() for ax in fig.axes)
    assert a_lo < 1.0 < 1.0999 < a_hi < 2 and 8 < b_lo < 9.0 < 9.0999 < b_hi
    assert len(plot.draw(b, "t", linear=True).axes) == 1
    out = tmp_path / "t.png"
    assert run_plot([src, "-o", str(out), "--linear"]) == 0 and png_size(out)[0] == plot.WIDTH


def test_start_and_end(tmp_path, mpl):
    src = early_reads_late_writes(tmp_path / "t.txt")
    b = plot.Binner(500, start_ns=1_500_000_000, end_ns=2_500_000_000)
    from mmiotrace_ng.analysis.accesses import events, open_trace

    for ev in events(open_trace(src)):
        b.feed(ev)
    b.flush()
    assert b.counts["R"] == 500 and b.counts["W"] == 501     # 2.0 .. 2.5 s both ends
    (ax,) = plot.draw(b, "t").axes
    lo, hi = ax.get_xlim()
    assert 1.48 < lo < 1.5 and 2.5 < hi < 2.52
    out = tmp_path / "t.png"
    assert run_plot([src, "-o", str(out), "--start", "1.5", "--end", "2.5"]) == 0
    assert run_plot([src, "-o", str(out), "--start", "2", "--end", "1"]) == 2


def test_recorded_file(tmp_path, mpl):
    path = tmp_path / "t.rec"
    recs = []
    for i in range(2000):
        r = NgRecAccess(phys=BASE + 4 * (i % 8), value=i, map_id=1, width=4, op=i % 2,
                        compat_width=4, compat_op=i % 2)
        r.hdr.ts_ns, r.hdr.cpu, r.hdr.type = 5_000_000_000 + 50_000 * i, i % 3, \
            NgRecType.NG_REC_ACCESS
        recs.append(bytes(r))
    w = rawfile.RawWriter(str(path))
    w.header("VERSION 20070824\n" + PCIDEV)
    w.records(recs)
    w.end(0, 0, None, None)
    w.close()
    out = tmp_path / "t.png"
    assert run_plot([str(path), "-o", str(out), "--size", "640x480"]) == 0
    assert png_size(out) == (640, 480)


def test_empty_trace_and_unwritable_output(tmp_path, mpl, capsys):
    src = tmp_path / "t.txt"
    src.write_text("VERSION 20070824\n")
    out = tmp_path / "t.png"
    assert run_plot([str(src), "-o", str(out)]) == 0 and png_size(out)[0] == plot.WIDTH
    assert run_plot([str(src), "-o", str(tmp_path / "no" / "t.png")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # its import fails
    src = early_reads_late_writes(tmp_path / "t.txt")
    out = tmp_path / "t.png"
    assert run_plot([src, "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"mmiotrace-ng: {plot.MISSING}\n"
    assert plot.MISSING == ("plot needs matplotlib: install the distribution's package "
                           "(Debian, Ubuntu: apt install python3-matplotlib) or pip install "
                           "'mmiotrace-ng[plot]'")
    assert not out.exists()


def test_bins_merge_and_keep_every_access(mpl, monkeypatch):
    """A long trace in few bins, some accesses out of time order: each access
    is in the bin of its time, and the bins stay as many."""
    import numpy as np

    monkeypatch.setattr(plot, "BATCH", 50)     # the bins merge many times over
    b = plot.Binner(64)
    times = [10**9 + k * 7_919_000 for k in range(5000)]
    times[100], times[4000] = times[100] - 3 * 10**9 // 4, times[4000] + 10**6   # out of order
    for k, ts in enumerate(times):
        b.feed(Event("R" if k % 2 else "W", ts, 0, 1, BASE + 4 * (k % 3), 4, k))
    b.flush()
    assert b.grid.shape[1] == 64 and (max(times) - min(times)) / b.width_ns <= 64
    assert b.lo is not None
    for k, ts in enumerate(times):
        row = b.rows["a", BASE + 4 * (k % 3)]
        assert b.grid[row, ts // b.width_ns - b.lo] & (plot.READ if k % 2 else plot.WRITE)
    # and nothing where nothing was: marks in as many bins as the times give
    want = {(b.rows["a", BASE + 4 * (k % 3)], ts // b.width_ns - b.lo, k % 2)
            for k, ts in enumerate(times)}
    assert int(np.count_nonzero(b.grid & plot.READ)) == sum(1 for w in want if w[2])
    assert int(np.count_nonzero(b.grid & plot.WRITE)) == sum(1 for w in want if not w[2])


def test_rows_merge_past_the_limit(mpl, monkeypatch):
    """More distinct addresses than MAX_ROWS: neighbours share rows, and each
    access is in the row whose range holds its address."""
    monkeypatch.setattr(plot, "MAX_ROWS", 64)
    b = plot.Binner(100)
    b.feed(Event("MAP", 10**9, 0, 1, BASE, length=0x20000))
    addrs = [BASE + 4 * k for k in range(1000)]
    for k, phys in enumerate(addrs):
        b.feed(Event("W", 10**9 + 1000 * k, 0, 1, phys, 4, k))
    b.flush()
    assert len(b.rows) <= 64 and b.shift > 0
    for phys in addrs:
        assert b.grid[b.rows["a", phys >> b.shift]].any()
    labels, grid, title = plot.rows(b)
    span = 1 << b.shift
    assert labels[0] == f"+0x0000..+0x{span - 1:04x}"      # the range one row holds
    assert len(labels) == len(grid) == len(b.rows)


def test_alike_neighbours_are_one_row(mpl):
    """A table written in one go (8 registers, the same instant) is one row;
    two registers alike are not merged, nor are rows that differ."""
    b = plot.Binner(100)
    for k in range(8):
        b.feed(Event("W", 10**9, 0, 1, BASE + 0x100 + 4 * k, 4, 0))
    for k in range(2):
        b.feed(Event("R", 2 * 10**9, 0, 1, BASE + 4 * k, 4, 0))
    b.feed(Event("R", 3 * 10**9, 0, 1, BASE + 0x200, 4, 0))
    b.feed(Event("MAP", 0, 0, 1, BASE, length=0x1000))     # after the accesses: no base
    b.flush()
    labels, grid, title = plot.rows(b)
    assert labels == ["0xfeb40000", "0xfeb40004", "0xfeb40100..0xfeb4011c (8)", "0xfeb40200"]
    assert title == "address"
    # --no-merge: a row for each
    labels, grid, _title = plot.rows(b, merge=False)
    assert labels == ["0xfeb40000", "0xfeb40004",
                      *(f"0xfeb401{4 * k:02x}" for k in range(8)), "0xfeb40200"]
    assert len(grid) == len(labels)


def test_plot_of_the_cli(tmp_path, mpl):
    from mmiotrace_ng import cli

    out = tmp_path / "t.png"
    src = early_reads_late_writes(tmp_path / "t.txt")
    assert cli.main(["plot", src, "-o", str(out), "--size", "300x200"]) == 0
    assert png_size(out) == (300, 200)
    with pytest.raises(SystemExit) as exc:
        cli.main(["plot", src, "-o", str(out), "--size", "big"])
    assert exc.value.code == 2


def test_mark_text_as_it_is(tmp_path, mpl):
    """MARK text is no TeX ($...$) and may hold bytes that are not UTF-8."""
    src = tmp_path / "t.txt"
    src.write_bytes(b"VERSION 20070824\nR 4 1.000000 1 0x10 0x1 0x0 0\n"
                    b"MARK 1.000001 cost $5 and \\frac{$6} \xff\nW 4 1.000010 1 0x14 0x1 0x0 0\n")
    b = plot.Binner(100)
    from mmiotrace_ng.analysis.accesses import events, open_trace

    for ev in events(open_trace(str(src))):
        b.feed(ev)
    b.flush()
    fig = plot.draw(b, "$x$.txt")
    assert "cost $5 and \\frac{$6} \ufffd" in [tx.get_text() for tx in fig.axes[0].texts]
    out = tmp_path / "t.png"
    fig.savefig(out, format="png")
    assert png_size(out) == (plot.WIDTH, 480)


def test_time_labels_never_overlap(tmp_path, mpl):
    """Three stretches of accesses, the first a few microseconds long and
    far from the others (a narrow segment between cut idle stretches, where
    two labels of 7 digits were drawn over each other): every time label
    drawn is clear of its neighbours (4 pixels apart at least), and each
    segment has one at least."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    lines = [f"R 4 {t(us)} 1 0x{BASE:x} 0x1 0x0 0\n" for us in (70_591_458, 70_591_688,
                                                               70_591_727, 70_591_735)]
    lines += [f"R 4 {t(us)} 1 0x{BASE:x} 0x1 0x0 0\n" for us in range(70_594_967, 70_597_645, 9)]
    lines += [f"R 4 {t(us)} 1 0x{BASE:x} 0x1 0x0 0\n" for us in range(70_602_686, 70_608_979, 6)]
    fig = plot.draw(binned(write_trace(tmp_path / "t.txt", lines), 1600), "t")
    assert len(fig.axes) == 3
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    boxes = []
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        shown = [lab.get_window_extent(canvas.get_renderer())
                 for tick, lab in zip(ax.get_xticks(), ax.get_xticklabels(), strict=True)
                 if lo <= tick <= hi and lab.get_text()]
        assert shown, f"no time label under {lo:.6f}..{hi:.6f}"
        boxes += shown
    for left, right in zip(boxes, boxes[1:], strict=False):
        assert left.x1 + 4 <= right.x0, (left, right)
