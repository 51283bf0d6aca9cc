"""annotate, export and plot on a real recording, in the guest: the
recording's own symbols name the exerciser's functions, the edu register
map names the registers, polling folds, each CPU gets its track."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from ng_tracer import ARTIFACTS, NG

RUN = Path("/sys/kernel/debug/edu_exerciser/run")
READS = 300
BURST = 500         # reads on each of two CPUs


def ng(*argv: str | Path) -> subprocess.CompletedProcess:
    res = subprocess.run([*NG, *map(str, argv)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return res


def test_annotate_export_and_plot_of_a_recording(exerciser):
    rec = ARTIFACTS / "ng-analysis.rec"
    steps = ["readl", f"rloop {READS}", f"burst {BURST}"]
    ng("record", "--pci", exerciser.dev.name, "-o", rec, "--", "sh", "-c",
       "; ".join(f"echo '{s}' > {RUN}" for s in steps))

    lines = ng("annotate", rec).stdout.splitlines()
    ident = [ln for ln in lines if re.search(r" R 4 ID +0x10000ed ", ln)]
    # readl's own read, the folded loop, the folded burst (one run per CPU at most)
    assert ident and all("[edu_exerciser]" in ln for ln in ident), ident
    assert any("sc_readl+0x" in ln for ln in ident), ident
    assert any(f"(x{READS}," in ln and "sc_rloop+0x" in ln for ln in ident), ident
    assert any(re.search(r" R 4 STATUS +0x0 ", ln) for ln in lines)

    out = ARTIFACTS / "ng-analysis.json"
    ng("export", "--chrome", out, rec)
    events = json.loads(out.read_text())["traceEvents"]
    reads = [e for e in events if e["ph"] == "X" and e["name"].startswith("R ")]
    assert len(reads) == 4 + READS + 2 * BURST
    values = {e["args"]["value"] for e in reads if e["name"] == "R ID"}
    assert values == {"0x10000ed"}, values
    burst_cpus = {e["tid"] for e in reads if "edu_burst_fn+" in e["args"].get("caller", "")}
    assert len(burst_cpus) == 2, burst_cpus       # the burst runs on two CPUs at once
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {f"CPU {c}" for c in burst_cpus} <= names

    png = ARTIFACTS / "ng-analysis.png"
    ng("plot", rec, "-o", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
