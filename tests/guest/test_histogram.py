"""mmiotrace-ng --pci BDF --histogram: the counts kept in the kernel equal
those derived from the full trace of the same scenarios (taken with --pc,
folded by access type, width, BAR offset and function by this test)."""

from __future__ import annotations

import re
import subprocess
from collections import Counter

from conftest import EXERCISER_DEBUGFS
from ng_tracer import NG

from mmiotrace_ng.symbols import Kallsyms

RUN = EXERCISER_DEBUGFS / "run"
SCENARIOS = f"echo readl > {RUN}; echo 'rloop 300' > {RUN}; echo 'wloop 200' > {RUN}; " \
            f"echo writeb > {RUN}; echo readq > {RUN}"
RW = re.compile(r"^(R|W) (\d+) \S+ \d+ 0x([0-9a-f]+) 0x([0-9a-f]+) 0x([0-9a-f]+) \d+$")


def from_trace(text: str, base: int, syms: Kallsyms) -> tuple[Counter, dict]:
    counts: Counter = Counter()
    last: dict = {}
    for ln in text.splitlines():
        if m := RW.match(ln):
            fn = syms.function(int(m[5], 16))
            name = fn.split("+", 1)[0] + (fn[fn.rindex(" ["):] if fn.endswith("]") else "")
            key = (m[1], int(m[2]), int(m[3], 16) - base, name)
            counts[key] += 1
            last[key] = int(m[4], 16)
    return counts, last


def test_histogram_equals_the_full_trace(exerciser):
    dev = exerciser.dev.name
    full = subprocess.run([*NG, "--pci", dev, "--pc", "--", "sh", "-c", SCENARIOS],
                          capture_output=True, text=True, timeout=900)
    assert full.returncode == 0, full.stderr
    hist = subprocess.run([*NG, "--pci", dev, "--histogram", "--", "sh", "-c", SCENARIOS],
                          capture_output=True, text=True, timeout=900)
    assert hist.returncode == 0, hist.stderr
    syms = Kallsyms()
    want, want_last = from_trace(full.stdout, exerciser.bar0[0], syms)
    assert sum(want.values()) > 500, full.stdout[:2000]
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
                or RW.match(ln)], hist.stdout
