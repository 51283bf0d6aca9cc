"""export --parquet and query on the guest suite's real recordings, against
what is known of them without the tables: the scenarios' records
(tests/drivers/edu_exerciser/scenarios.py), the live tracer's --histogram
of the same scenarios, and the text of each recording as report prints it
(read here with a regular expression of the 20070824 lines); the kernel
tracer's text and a recording of the same scenarios give equal tables."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from recorded import NG, RECORDED, REPO, recording

sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(REPO / "tests" / "drivers" / "edu_exerciser"))
import scenarios as sc  # noqa: E402
from ng_require import optional  # noqa: E402

ACCESS = re.compile(r"^([RW]) (\d+) (\d+\.\d{6}) (-?\d+) 0x([0-9a-f]+) 0x([0-9a-f]+)", re.M)
MARK = re.compile(r"^MARK \d+\.\d{6} (.*)$")
ANALYSIS = [("readl", None), ("writel", None), ("rloop", 300), ("burst", 500)]


@pytest.fixture(autouse=True)
def _extras():
    optional("pyarrow", "python3-pyarrow", "pyarrow is not installed (python3-pyarrow, or "
             "pip install 'mmiotrace-ng[sql]')")
    optional("duckdb", None, "duckdb is not installed (pip install 'mmiotrace-ng[sql]')")


def ng(*argv: object) -> str:
    res = subprocess.run([*NG, *map(str, argv)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return res.stdout


def query(src: Path, *argv: str) -> list[dict]:
    return json.loads(ng("query", src, *argv, "--json"))


def text_accesses(text: str) -> list[tuple[str, int, int, int]]:
    """(op, width, phys, value) of each R/W line, in order."""
    return [(m[1], int(m[2]), int(m[5], 16), int(m[6], 16)) for m in ACCESS.finditer(text)]


def known_counts(runs) -> Counter:
    """(op, width, BAR offset) -> count of the scenarios' records."""
    out: Counter = Counter()
    for name, n in runs:
        for r in sc.expected(name, n):
            if r[0] in ("R", "W"):
                out[r[0], r[1], r[2]] += 1
    return out


REGISTER_COUNTS = ("SELECT kind, width, bar_offset, count(*) AS n FROM records "
                   "WHERE kind IN ('R', 'W') GROUP BY ALL")


def test_counts_per_register_are_the_scenarios(tmp_path):
    """The exerciser's scenarios: SQL's counts per register are those the
    scenarios make, and those of the recording's text; --top-registers says
    the same; the poll of 300 reads is one run in sc_rloop, the burst's
    reads are runs in edu_burst_fn on two CPUs."""
    rec, facts = recording("analysis")
    got = Counter({(r["kind"], r["width"], r["bar_offset"]): r["n"]
                   for r in query(rec, REGISTER_COUNTS)})
    assert got == known_counts(ANALYSIS)
    bar0 = facts["bar0"]
    text = Counter((op, w, phys - bar0) for op, w, phys, _ in text_accesses(ng("report", rec)))
    assert got == text
    top = query(rec, "--top-registers")
    assert Counter({(r["kind"], r["width"], int(r["offset"], 16)): r["count"]
                    for r in top}) == got
    polls = query(rec, "--polls")
    loop = [p for p in polls if p["function"] == "sc_rloop [edu_exerciser]"]
    assert [p["reads"] for p in loop] == [300], polls
    burst = [p for p in polls if p["function"] == "edu_burst_fn [edu_exerciser]"]
    assert sum(p["reads"] for p in burst) <= 2 * 500 and len({p["cpu"] for p in burst}) == 2
    # every read of the burst is in a run, or alone between two CPUs' records
    assert sum(p["reads"] for p in burst) >= 2 * 500 - 2 * len(burst), burst


def test_counts_per_function_are_the_histograms():
    """The same scenarios under --histogram (counts kept in the kernel) and
    recorded: SQL's counts per op, width, offset and function are the
    histogram's rows."""
    rec, _ = recording("histogram")
    table = RECORDED / "histogram.txt"
    assert table.exists(), f"{table} is missing: the guest test saves it beside the recording"
    want = {}
    lines = table.read_text().splitlines()
    assert lines[0].split()[:2] == ["Type", "Width"], lines[:2]
    for ln in lines[1:]:
        f = ln.split()
        want[f[0], int(f[1]), int(f[4], 16), " ".join(f[5:-2])] = int(f[-2])
    got = query(rec, "SELECT kind, width, bar_offset, symbol || ' [' || module || ']' AS fn, "
                     "count(*) AS n FROM records WHERE kind IN ('R', 'W') GROUP BY ALL")
    assert {(r["kind"], r["width"], r["bar_offset"], r["fn"]): r["n"] for r in got} == want


def test_e1000_load_counts_and_last_values(tmp_path):
    """A load of e1000 (a real driver, thousands of accesses): the export's
    counts per register are the text's, --last-values is the last value of
    each address in the text, and the registers are named by e1000.regs."""
    rec, facts = recording("diff-e1000-1")
    out = tmp_path / "e1000"
    ng("export", "--parquet", out, rec)
    text = text_accesses(ng("report", rec))
    assert len(text) > 1000
    got = Counter({(r["kind"], r["width"], r["phys"]): r["n"] for r in query(
        out, "SELECT kind, width, phys, count(*) AS n FROM records "
             "WHERE kind IN ('R', 'W') GROUP BY ALL")})
    assert got == Counter((op, w, phys) for op, w, phys, _ in text)
    last = {phys: (op, value) for op, _, phys, value in text}
    rows = query(out, "--last-values")
    assert {int(r["phys"], 16): (r["kind"], int(r["value"], 16)) for r in rows} == last
    named = {r["register"] for r in rows if r["bdf"] == facts["bdf"].removeprefix("0000:")}
    assert {"CTRL", "STATUS", "EECD", "MDIC", "RCTL", "TCTL"} <= named, named


def test_between_is_the_records_between_the_marks():
    """--between init extra: the records between those two MARK lines of
    the text; --before run: the records before the MARK run."""
    rec, _ = recording("sections-b")
    lines = ng("report", rec).splitlines()
    marks = {m[1]: i for i, ln in enumerate(lines) if (m := MARK.match(ln))}
    assert {"init", "extra", "run"} <= set(marks), marks
    want = text_accesses("\n".join(lines[marks["init"] + 1:marks["extra"]]))
    got = query(rec, "--between", "init", "extra")
    assert [(r["kind"], r["width"], int(r["phys"], 16), int(r["value"], 16))
            for r in got if r["kind"] in ("R", "W")] == want
    kinds = [ln.split()[0] for ln in lines[marks["init"] + 1:marks["extra"]]]
    assert [r["kind"] for r in got] == kinds
    before = text_accesses("\n".join(lines[:marks["run"]]))
    rows = query(rec, "--last-values", "--before", "run")
    assert {int(r["phys"], 16): int(r["value"], 16) for r in rows} == \
        {phys: value for _, _, phys, value in before}


def test_the_kernel_tracers_text_and_a_recording_give_equal_tables(tmp_path):
    """The same scenarios under the kernel's mmiotrace and recorded by
    mmiotrace-ng: equal records tables once time, virtual addresses and map
    ids are dropped, and what the kernel's text has no column for (CPU, pc,
    pid, the pc's symbol)."""
    pq = optional("pyarrow.parquet", "python3-pyarrow", "pyarrow is not installed")
    ours, _ = recording("diff-k")
    kernel = ours.parent / "diff-kernel.txt"
    assert kernel.exists(), f"{kernel} is missing: the guest test saves it"
    tables = {}
    for name, src in (("kernel", kernel), ("ours", ours)):
        ng("export", "--parquet", tmp_path / name, src)
        tables[name] = pq.read_table(tmp_path / name / "records.parquet").to_pylist()
    drop = {"seq", "ts_ns", "virt", "map_id", "cpu", "pc", "pid", "symbol", "symbol_offset",
            "module"}
    a, b = ([{k: v for k, v in r.items() if k not in drop} for r in tables[n]]
            for n in ("kernel", "ours"))
    assert len(a) == len(b) and a == b
    assert Counter(r["kind"] for r in a)["W"] >= 50      # wloop 50 and the rest
