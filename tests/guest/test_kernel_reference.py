"""The kernel's own mmiotrace as the reference: the exerciser's documented
record sequences (tests/drivers/edu_exerciser/scenarios.py) against what the
kernel's tracer prints, plus e1000 and trace_marker checks.

Run inside the VM:
    tests/vm/run --qemu '-device edu' \\
        --qemu '-device e1000,netdev=n0 -netdev user,id=n0' \\
        --append modprobe.blacklist=e1000 --timeout 900 -- \\
        .venv/bin/python -m pytest -v tests/guest/test_kernel_reference.py
"""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import memset_bytewise
from kernel_tracer import (
    capture,
    find_pci_device,
    map_id_problems,
    normalize,
    to_records,
)

_SCENARIOS_PY = (Path(__file__).resolve().parents[1] / "drivers" / "edu_exerciser"
                 / "scenarios.py")
_spec = importlib.util.spec_from_file_location("edu_scenarios", _SCENARIOS_PY)
scenarios = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scenarios)

# Small COUNTs for the parametric scenarios; 11 gives cloop both tails.
SMALL_COUNT = {"rloop": 10, "wloop": 10, "cloop": 11, "burst": 10}
E1000_ID = (0x8086, 0x100E)
TRACE_MARKER = Path("/sys/kernel/tracing/trace_marker")


def _cpu_has_erms() -> bool:
    """memset_io() is byte stores (what scenarios.expected calls erms)."""
    return memset_bytewise()


def _unmaps_seen(n: int):
    return lambda text: sum(line.startswith("UNMAP ") for line in text.splitlines()) >= n


def _write_marker(text: str) -> None:
    fd = os.open(TRACE_MARKER, os.O_WRONLY)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def test_module_lists_the_documented_scenarios(exerciser):
    assert exerciser.scenarios() == scenarios.NAMES
    assert exerciser.bar0[1] == scenarios.BAR0_LEN


@pytest.mark.parametrize(("command", "err"), [
    ("nosuch", errno.EINVAL),
    ("readl 5", errno.EINVAL),          # no COUNT for a fixed scenario
    ("rloop x", errno.EINVAL),
    ("rloop 1 2", errno.EINVAL),
    ("rloop 100000001", errno.EINVAL),  # above the maximum COUNT
    ("cloop 1044481", errno.EINVAL),    # more than BAR0 after 0x1000
])
def test_bad_commands_are_refused(exerciser, command, err):
    name, _, count = command.partition(" ")
    with pytest.raises(OSError) as info:
        exerciser.run(name, count or None)
    assert info.value.errno == err


@pytest.mark.parametrize("name", scenarios.NAMES)
def test_scenario_matches_kernel_mmiotrace(exerciser, name):
    count = SMALL_COUNT.get(name)
    want = scenarios.expected(name, count, kernel=True, erms=_cpu_has_erms())
    text = capture(lambda: exerciser.run(name, count),
                   until=_unmaps_seen(want.count(scenarios.UNMAP)))
    lines = text.splitlines()
    assert lines[0] == "VERSION 20070824"
    edu = [line for line in lines if line.startswith("PCIDEV ")
           and line.split()[2] == "123411e8"]
    assert len(edu) == 1 and edu[0].endswith(" edu_exerciser"), edu
    assert map_id_problems(text) == []
    got = to_records(text, exerciser.bar0[0])
    assert got == want


def test_normalize_hides_only_run_dependent_fields(exerciser):
    """Two runs of a scenario normalize to the same lines, though their
    timestamps, map ids and virtual addresses differ."""
    runs = []
    for _ in range(2):
        text = capture(lambda: exerciser.run("writel"), until=_unmaps_seen(1))
        runs.append([line for line in text.splitlines()
                     if not line.startswith(("VERSION", "PCIDEV"))])
    assert runs[0] != runs[1]                     # ids and times moved on
    assert normalize("\n".join(runs[0])) == normalize("\n".join(runs[1]))
    assert normalize("\n".join(runs[0]))[0].startswith("MAP T M1 ")


def test_burst_both_cpus_untraced(exerciser):
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    assert online == "0-1", f"need CPUs 0 and 1 online (boot with --cpus 2), have {online}"
    exerciser.run("burst", 200000)      # raises OSError(EIO) on a wrong value
    assert exerciser.mismatches() == 0
    assert sorted(exerciser.burst_cpus()) == [0, 1]


def test_trace_marker_in_stream(exerciser):
    tag = f"mmiotrace-ng marker {uuid.uuid4().hex}"

    def trigger():
        _write_marker(tag + " before")
        exerciser.run("readl")
        _write_marker(tag + " after")

    text = capture(trigger, until=lambda t: tag + " after" in t)
    body = [line for line in text.splitlines()
            if not line.startswith(("VERSION", "PCIDEV"))]
    assert re.fullmatch(r"MARK \d+\.\d{6} " + re.escape(tag + " before"), body[0]), body
    assert re.fullmatch(r"MARK \d+\.\d{6} " + re.escape(tag + " after"), body[-1]), body
    assert to_records("\n".join(body), exerciser.bar0[0], with_marks=True) == [
        ("MARK", tag + " before"), *scenarios.expected("readl", kernel=True),
        ("MARK", tag + " after")]


def test_e1000_modprobe_under_kernel_mmiotrace():
    dev = find_pci_device(*E1000_ID)
    assert dev is not None, ("no e1000 NIC: boot the VM with "
                             "--qemu '-device e1000,netdev=n0 -netdev user,id=n0'")
    assert not Path("/sys/module/e1000").exists(), \
        "e1000 already loaded: boot with --append modprobe.blacklist=e1000"
    start, length = dev.bars[0]
    bar0_map = f" 0x{start:x} "
    try:
        text = capture(lambda: subprocess.run(["modprobe", "e1000"], check=True),
                       until=lambda t: any(line.startswith("MAP ") and bar0_map in line
                                           for line in t.splitlines()),
                       quiet=1.0, timeout=120)
    finally:
        if Path("/sys/module/e1000").exists():
            subprocess.run(["rmmod", "e1000"], check=True)
    recs = to_records(text, start)
    maps = [r for r in recs if r[0] == "MAP"]
    assert ("MAP", 0, length) in maps, maps
    lost = [r for r in recs if r[0] == "LOST"]
    assert not lost, lost
    n_read = sum(r[0] == "R" for r in recs)
    n_write = sum(r[0] == "W" for r in recs)
    assert n_read > 3000 and n_write > 3000, (n_read, n_write)
    # Every access falls inside BAR0 (the only mapping e1000 makes).
    outside = [r for r in recs if r[0] in ("R", "W") and not 0 <= r[2] < length]
    assert not outside, outside[:5]
