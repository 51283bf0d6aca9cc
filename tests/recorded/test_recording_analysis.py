"""annotate, export and plot of a real recording, on the host: the guest
test (tests/guest/test_analysis.py) recorded the exerciser's scenarios in
this run of tests/run; here the recording's own symbols name the
exerciser's functions, the edu register map names the registers, polling
folds, each CPU gets its track.  Nothing of it needs the guest, and under
TCG it took a minute and a half."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from recorded import NG, REPO, recording

REGS = REPO / "mmiotrace_ng" / "data" / "regs"

READS = 300         # what the guest test made: rloop 300, burst 500
BURST = 500         # reads on each of two CPUs


def ng(*argv: str | Path) -> subprocess.CompletedProcess:
    res = subprocess.run([*NG, *map(str, argv)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return res


TIMES = re.compile(r"^ +(\d+\.\d{6}) +\+(\d+\.\d{6}) (.*)$")
FOLD = r"(?: \(x(\d+), [^)]*\))?"
FN = r"\+0x[0-9a-f]+ \[edu_exerciser\]"


def assert_annotated(lines: list[str], bdf: str, bar: int) -> None:
    """Every line of the listing, whole: the PCI header, then the three
    mappings with their accesses as the scenarios make them (names and
    fields from edu's register map, the function of each access, polls
    folded with their counts), each line's delta the time since the line
    before (where that one is not a folded run)."""
    head = [ln for ln in lines if ln.startswith("# ")]
    assert f"# PCI {bdf} 1234:11e8 (edu_exerciser): BAR0 {bar:#x}+0x100000 [edu.regs]" in head
    body = [ln for ln in lines if not ln.startswith("# ")]
    assert len(head) + len(body) == len(lines)
    parsed = [TIMES.match(ln) for ln in body]
    assert all(parsed), [ln for ln, m in zip(body, parsed, strict=True) if not m]
    for prev, cur in zip(parsed, parsed[1:], strict=False):
        if "(x" not in prev[3]:
            gap = float(cur[1]) - float(prev[1])
            assert abs(float(cur[2]) - gap) < 2e-6, (prev[0], cur[0])
    text = [m[3] for m in parsed]
    mapped = f"0x{bar:x} len 0x100000  {bdf} 1234:11e8 BAR0"
    ident = r"R 4 ID         0x10000ed \{MAJOR=1 MAGIC=0xed\}"
    want = [
        rf"#1 MAP {mapped} \(edu_exerciser\)  regs edu\.regs",
        rf"#1 {ident}  sc_readl{FN}",
        rf"#1 R 4 STATUS     0x0 \{{\}}  sc_readl{FN}",
        rf"#1 R 4 IRQ_STATUS 0x0  sc_readl{FN}",
        rf"#1 R 4 \+0x0040    0xffffffff  sc_readl{FN}",
        rf"#1 UNMAP  {mapped}",
        rf"#2 MAP {mapped} \(edu_exerciser\)  regs edu\.regs",
        rf"#2 W 4 LIVENESS   0x12345678  sc_writel{FN}",
        rf"#2 R 4 LIVENESS   0xedcba987  sc_writel{FN}",
        rf"#2 UNMAP  {mapped}",
        rf"#3 MAP {mapped} \(edu_exerciser\)  regs edu\.regs",
        rf"#3 {ident} \(x{READS}, [^)]*\)  sc_rloop{FN}",
        rf"#3 UNMAP  {mapped}",
        rf"#4 MAP {mapped} \(edu_exerciser\)  regs edu\.regs",
    ]
    for i, pattern in enumerate(want):
        assert re.fullmatch(pattern, text[i]), (i, pattern, text[i])
    # the burst: the reads of two CPUs at one place, in runs
    burst = [re.fullmatch(rf"#4 {ident}{FOLD}  edu_burst_fn{FN}", t) for t in text[len(want):-1]]
    assert all(burst), text[len(want):-1]
    assert sum(int(m[1] or 1) for m in burst) == 2 * BURST, text[len(want):-1]
    assert re.fullmatch(rf"#4 UNMAP  {mapped}", text[-1]), text[-1]


def test_annotate_export_and_plot_of_a_recording(tmp_path):
    rec, facts = recording("analysis")
    bdf, bar = facts["bdf"].removeprefix("0000:"), facts["bar0"]

    lines = ng("annotate", rec).stdout.splitlines()
    assert_annotated(lines, bdf, bar)

    out = tmp_path / "analysis.json"
    ng("export", "--chrome", out, rec)
    events = json.loads(out.read_text())["traceEvents"]
    reads = [e for e in events if e["ph"] == "X" and e["name"].startswith("R ")]
    assert len(reads) == 4 + 1 + READS + 2 * BURST
    values = {e["args"]["value"] for e in reads if e["name"] == "R ID"}
    assert values == {"0x10000ed"}, values
    burst_cpus = {e["tid"] for e in reads if "edu_burst_fn+" in e["args"].get("caller", "")}
    assert len(burst_cpus) == 2, burst_cpus       # the burst runs on two CPUs at once
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {f"CPU {c}" for c in burst_cpus} <= names

    png = tmp_path / "analysis.png"
    ng("plot", rec, "-o", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_plotted(png)


def bands(mask) -> list[tuple[int, int]]:
    """(first, last) pixel rows of each run of rows where mask has pixels."""
    rows = [y for y in range(mask.shape[0]) if mask[y].any()]
    out: list[tuple[int, int]] = []
    for y in rows:
        if out and y == out[-1][1] + 1:
            out[-1] = (out[-1][0], y)
        else:
            out.append((y, y))
    return out


def assert_plotted(png: Path) -> None:
    """The pixels of the plot: five register rows, ID (0x00), LIVENESS
    (0x04), STATUS (0x20), IRQ_STATUS (0x24) and 0x40 from the top, each
    with read marks (blue); the one write (red) in LIVENESS's row, below
    its read; nothing grey (no UNKNOWN).  ID's row has the loop and the
    burst, so its marks run across the plot; the others have one access
    each.  (The title and the legend, above the plot, are
    left out.)"""
    import matplotlib.image
    import numpy as np

    rgb = (matplotlib.image.imread(png)[:, :, :3] * 255).round().astype(int)
    plot = rgb[rgb.shape[0] // 16 :]       # below the title and the legend

    def colour(hexa: str):
        return (plot == [int(hexa[i:i + 2], 16) for i in (1, 3, 5)]).all(axis=2)

    read, write, grey = colour("#1f60c4"), colour("#d62728"), colour("#8c8c8c")
    rows = bands(read)
    assert len(rows) == 5, rows
    left = int(read.any(axis=0).argmax())             # the data's area: no grey in it
    assert not grey[rows[0][0] : rows[-1][1] + 1, left:].any()
    (w,) = bands(write)
    assert rows[1][1] < w[0] and w[1] < rows[2][0], (rows, w)     # LIVENESS's write
    xs = [np.nonzero(read[a:b + 1].any(axis=0))[0] for a, b in rows]
    assert xs[0].max() - xs[0].min() > plot.shape[1] // 2, "ID's marks do not run across"
    # the others: one access each, a mark a few pixels wide (where it falls
    # depends on which idle stretches were cut)
    assert all(x.max() - x.min() < 8 for x in xs[1:]), [(x.min(), x.max()) for x in xs]


def test_annotate_kallsyms_names_the_callers_of_a_text_trace(tmp_path):
    """The recording's text with pcs (report --pc: the lines a live --pc run
    prints) and the traced machine's saved /proc/kallsyms: annotate names
    every caller as it does from the recording's own symbols."""
    rec, _ = recording("analysis")
    text = tmp_path / "analysis.txt"
    text.write_text(ng("report", "--pc", rec).stdout)
    kallsyms = rec.with_suffix(".kallsyms")
    assert kallsyms.exists(), f"{kallsyms} is missing: the guest test saves it"
    from_text = ng("annotate", "--kallsyms", kallsyms, text).stdout.splitlines()
    assert from_text == ng("annotate", rec).stdout.splitlines()
    bare = ng("annotate", text).stdout
    assert "[edu_exerciser]" not in bare and "sc_readl" not in bare


def test_annotate_regs_takes_the_given_map(tmp_path):
    """A register map of one's own (edu's, its ID register and MAGIC field
    renamed): the listing is the shipped maps', with the new names, and no
    other map applied (--regs replaces the shipped ones: the e1000 of the
    test machine, in the header, gets none)."""
    rec, _ = recording("analysis")
    shipped = REGS / "edu.regs"
    mine = tmp_path / "mine.regs"
    mine.write_text(re.sub(r"^0x00 4 ID           ", "0x00 4 IDENT        ",
                           shipped.read_text().replace("  7:0   MAGIC  ", "  7:0   EDUMAG "),
                           flags=re.M))
    want = [ln.replace(" ID         ", " IDENT      ").replace("MAGIC=", "EDUMAG=")
               .replace("[edu.regs]", "[mine.regs]").replace("regs edu.regs", "regs mine.regs")
               .replace(" [e1000.regs]", "")
            for ln in ng("annotate", rec).stdout.splitlines()]
    got = ng("annotate", "--regs", mine, rec).stdout.splitlines()
    assert got == want
    assert any(" IDENT " in ln and "EDUMAG=0xed" in ln for ln in got), got[:20]
