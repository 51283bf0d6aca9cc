"""mmiotrace-ng --pci BDF --histogram: the counts kept in the kernel equal
what the scenarios run are known to make (scenarios.py), row for row: access
type, width, BAR offset, the function that made it (the scenario's own, as
/proc/kallsyms names it to this test), count and last value."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from conftest import EXERCISER_DEBUGFS
from ng_tracer import NG, RECORDED, recorded_for_host

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drivers" / "edu_exerciser"))
import scenarios as sc  # noqa: E402

RUN = EXERCISER_DEBUGFS / "run"
RUNS = [("readl", None), ("rloop", 300), ("wloop", 200), ("writeb", None), ("readq", None)]
SCENARIOS = "; ".join(f"echo '{sc.command(name, n)}' > {RUN}" for name, n in RUNS)


def module_functions(module: str) -> set[str]:
    """The text symbols of a module, from /proc/kallsyms."""
    out = set()
    for line in Path("/proc/kallsyms").read_text().splitlines():
        f = line.split()
        if len(f) == 4 and f[1] in "tT" and f[3] == f"[{module}]":
            out.add(f[2])
    return out


def known_counts() -> tuple[Counter, dict]:
    """The rows the scenarios make: each access is in its scenario's function
    (readl() and the like are inline)."""
    funcs = module_functions("edu_exerciser")
    counts: Counter = Counter()
    last: dict = {}
    for name, n in RUNS:
        fn = f"sc_{name}"
        assert fn in funcs, f"{fn} is not a function of edu_exerciser in /proc/kallsyms"
        for r in sc.expected(name, n):
            if r[0] in ("R", "W"):
                key = (r[0], r[1], r[2], f"{fn} [edu_exerciser]")
                counts[key] += 1
                last[key] = r[3]
    return counts, last


def test_histogram_equals_the_known_counts(exerciser):
    dev = exerciser.dev.name
    hist = subprocess.run([*NG, "--pci", dev, "--histogram", "--", "sh", "-c", SCENARIOS],
                          capture_output=True, text=True, timeout=900)
    assert hist.returncode == 0, hist.stderr
    want, want_last = known_counts()
    assert sum(want.values()) == 300 + 200 + 4 + 3 + 3, want
    lines = hist.stdout.splitlines()
    assert lines[0].split() == ["Type", "Width", "Region", "Offset", "Function", "Count", "Last"]
    got, got_last = Counter(), {}
    for ln in lines[1:]:
        f = ln.split()
        # Type Width BDF BARn Offset Function [module] Count Last
        assert f[2] == dev and f[3] == "BAR0", ln
        name = " ".join(f[5:-2])
        key = (f[0], int(f[1]), int(f[4], 16), name)
        assert key not in got, f"two rows for {key}"
        got[key], got_last[key] = int(f[-2]), int(f[-1], 16)
    assert got == want
    assert got_last == want_last
    # the table only: no trace around it
    assert not [ln for ln in lines if ln.startswith(("VERSION", "PCIDEV", "MAP ", "UNMAP "))
                or re.match(r"(R|W) \d+ \d+\.\d{6} ", ln)], hist.stdout
    # the same scenarios recorded, beside this table: the host's SQL over
    # the recording must count what the kernel counted (tests/recorded)
    RECORDED.mkdir(parents=True, exist_ok=True)
    (RECORDED / "histogram.txt").write_text(hist.stdout)
    recorded_for_host("histogram", ["record", "--pci", dev, "-o", "{rec}", "--",
                                    "sh", "-c", SCENARIOS],
                      bdf=dev, bar0=exerciser.bar0[0])
