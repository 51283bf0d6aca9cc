"""--singlestep: every access single-stepped, and still exact.

A decoded instruction is stepped against the helper's per-CPU window onto the
page (its address register moved for the one instruction), so no page is made present
and other CPUs keep faulting: a two-CPU burst under --singlestep must give
every read, as the emulating mode does.  Each scenario must print what the
emulating mode prints, with the string instructions as UNKNOWN (they are
stepped, not decoded into elements).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from conftest import memset_bytewise
from kernel_tracer import to_records
from ng_tracer import NgTracer, helper_status

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drivers" / "edu_exerciser"))
import scenarios as sc  # noqa: E402

BURST_N = 3000
COUNTED_N = 10


def erms() -> bool:
    """memset_io() is byte stores (what scenarios.expected calls erms)."""
    return memset_bytewise()


@pytest.fixture(scope="module")
def stepped(exerciser):
    t = NgTracer(["--pci", exerciser.dev.name, "--singlestep"], "ng-singlestep").start()
    yield t
    assert t.stop(signal.SIGINT) == 0
    st = helper_status()
    assert st["armed_pages"] == 0 and st["filters"] == 0, st


@pytest.mark.parametrize("name", [n for n in sc.NAMES if n != "burst"])
def test_scenario_under_singlestep(name, exerciser, stepped):
    count = COUNTED_N if name in sc.COUNTED else None
    before = helper_status()
    text = stepped.section(lambda: exerciser.run(name, count))
    assert to_records(text, exerciser.bar0[0]) == sc.expected(name, count, erms=erms())
    after = helper_status()
    # every access of the scenario was stepped, none emulated
    assert after["emulated"] == before["emulated"]
    assert after["singlestepped"] > before["singlestepped"]


def test_burst_under_singlestep_is_exact(exerciser, stepped):
    """Two CPUs read at once, every read single-stepped: all 2N are traced."""
    text = stepped.section(lambda: exerciser.run("burst", BURST_N))
    assert exerciser.burst_cpus()[0] != exerciser.burst_cpus()[1], "the burst needs two CPUs"
    recs = to_records(text, exerciser.bar0[0])
    lost = sum(r[1] for r in recs if r[0] == "LOST")
    reads = [r for r in recs if r[0] == "R"]
    assert lost == 0
    assert reads == [("R", 4, 0, sc.IDENT)] * (2 * BURST_N)
    assert exerciser.mismatches() == 0
