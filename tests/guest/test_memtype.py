"""Memory types stay the driver's: tracing a BAR reserves no memory type, so
a driver's ioremap_wc() of it is write-combining, as untraced, and its
accesses are traced (made through a window with the same type)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from kernel_tracer import to_records
from ng_tracer import NgTracer
from test_engine_safety import StressRun, dbg

PAT_LIST = Path("/sys/kernel/debug/x86/pat_memtype_list")
ROUNDS = 400


def memtypes(lo: int, hi: int) -> list[str]:
    """The pat_memtype_list entries that overlap [lo, hi)."""
    out = []
    for line in PAT_LIST.read_text().splitlines():
        # "PAT: [mem 0x00000000fea00000-0x00000000fea01000] write-combining"
        m = re.match(r"PAT: \[mem 0x([0-9a-f]+)-0x([0-9a-f]+)\] (.+)$", line)
        if m and int(m[1], 16) < hi and lo < int(m[2], 16):
            out.append(m[3].strip())
    return out


def test_ioremap_wc_of_a_traced_bar_stays_write_combining(exerciser):
    start = exerciser.bar0[0]
    t = NgTracer(["--pci", exerciser.dev.name], "ng-wc").start()
    try:
        before = memtypes(start, start + 4096)   # the traced BAR, nobody mapping it
        run = StressRun(f"wc_loop {ROUNDS}")
        try:
            deadline = time.monotonic() + 60
            while not dbg("wc_virt") and time.monotonic() < deadline:
                run.check_alive()
                time.sleep(0.01)
            during = memtypes(start, start + 4096)
        finally:
            run.proc.wait(300)
        assert run.proc.returncode == 0, run.proc.stderr.read()
        text = t.wait_for("UNMAP ")
    finally:
        assert t.stop() == 0
    assert before == [], before
    assert during == ["write-combining"], during
    # every access of the trace is the loop's (other mappings of the BAR,
    # made before the tracer, give MAP lines only)
    recs = to_records(text, start)
    want = []
    for i in range(ROUNDS):
        want += [("W", 4, 0x04, i), ("R", 4, 0x04, ~i & 0xFFFFFFFF)]
    assert [r for r in recs if r[0] in ("R", "W")] == want
    assert ("MAP", 0, 4096) in recs and recs[-1] == ("UNMAP",), recs[:3] + recs[-3:]
