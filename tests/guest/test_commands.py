"""Behaviours of the command line that no other test reaches, each checked
against what the kernel or the exerciser says: `-- CMD`'s exit status,
--histogram -i (the counts so far, every interval), `status` (against the
page table and the tracer's pid) and the helper's 256-range limit."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXERCISER_DEBUGFS
from held import held_pages, hold, wait_armed, wait_whole
from kernel_tracer import find_pci_device, to_records
from ng_tracer import NG, NgTracer, helper_status

import mmiotrace_ng.tracer.netlink as nl
from mmiotrace_ng.format.abi import MMIOTNG_MAX_FILTERS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drivers" / "edu_exerciser"))
import scenarios as sc  # noqa: E402

RUN = EXERCISER_DEBUGFS / "run"
PAGE = 4096
E1000_ID = (0x8086, 0x100E)


def test_the_commands_exit_status_is_the_tracers(exerciser):
    """-- CMD: traced while it runs, and its exit status (7) is the
    tracer's; the trace is the scenario's, record for record."""
    res = subprocess.run([*NG, "--pci", exerciser.dev.name, "--", "sh", "-c",
                          f"echo readl > {RUN}; exit 7"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 7, res.stderr
    assert to_records(res.stdout, exerciser.bar0[0]) == sc.expected("readl"), res.stdout[-2000:]
    assert helper_status()["filters"] == 0


def tables(text: str) -> list[dict[tuple, int]]:
    """The --histogram tables in text: {(type, width, offset, function): count}."""
    out: list[dict[tuple, int]] = []
    for ln in text.splitlines():
        f = ln.split()
        if f[:2] == ["Type", "Width"]:
            out.append({})
        elif out and len(f) >= 8 and f[0] in ("R", "W"):
            out[-1][(f[0], int(f[1]), int(f[4], 16), " ".join(f[5:-2]))] = int(f[-2])
    return out


def test_histogram_interval_prints_the_counts_so_far(exerciser):
    """--histogram -i 1: a table every second with the counts so far: one
    printed between the two loops counts the first loop's 300 reads, the
    last one both loops' 500."""
    res = subprocess.run([*NG, "--pci", exerciser.dev.name, "--histogram", "-i", "1", "--",
                          "sh", "-c", f"echo 'rloop 300' > {RUN}; sleep 4; "
                          f"echo 'rloop 200' > {RUN}"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    key = ("R", 4, 0x00, "sc_rloop [edu_exerciser]")
    counts = [t.get(key, 0) for t in tables(res.stdout)]
    # at least one table between the loops and the last (a loaded machine
    # prints fewer than one a second)
    assert len(counts) >= 2, res.stdout[-3000:]
    assert 300 in counts and counts[-1] == 500, counts
    assert counts == sorted(counts), counts             # counts so far: never fewer


def status_lines() -> dict[str, int]:
    res = subprocess.run([*NG, "status"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = {}
    for ln in res.stdout.splitlines():
        m = re.fullmatch(r"(\w+): (-?\d+)", ln)
        assert m, ln
        out[m[1]] = int(m[2])
    return out


def test_status_says_what_the_page_table_and_the_tracer_say(held):
    """`status` while a trace runs: the tracer's pid owns the helper, one
    range, every page of a mapping held from before armed (none present in
    the page table); afterwards nothing owned, filtered or armed, and every
    page present."""
    hold("map")
    _virt, pages, _present = held_pages()
    t = NgTracer(["--pci", held.dev.name], "ng-status").start()
    try:
        wait_armed()
        during = status_lines()
    finally:
        assert t.stop() == 0, t.stderr()
    wait_whole()
    after = status_lines()
    assert set(during) == set(nl.Status._fields), during
    assert during["owner"] == t.proc.pid, (during, t.proc.pid)
    assert during["filters"] == 1 and during["mappings"] >= 1, during
    assert during["armed_pages"] >= pages, during
    assert (after["owner"], after["filters"], after["mappings"], after["armed_pages"]) == \
        (0, 0, 0, 0), after


def test_the_helper_traces_256_ranges_at_most(exerciser):
    """256 ranges (each page of edu's BAR0) are taken; a 257th (a page of
    the NIC's BAR) is refused with ENOSPC and leaves the others; they all
    go with the session."""
    nic = find_pci_device(*E1000_ID)
    assert nic is not None, "boot the VM with --qemu '-device e1000,...'"
    start, length = exerciser.bar0
    assert length // PAGE == MMIOTNG_MAX_FILTERS == 256
    with nl.HelperSocket() as h:
        for off in range(0, length, PAGE):
            h.filter_add(start + off, PAGE)
        assert h.status().filters == 256
        with pytest.raises(nl.HelperError) as exc:
            h.filter_add(nic.bars[0][0], PAGE)
        assert exc.value.errno == errno.ENOSPC
        assert h.status().filters == 256
        h.filter_del(start, PAGE)
        h.filter_add(nic.bars[0][0], PAGE)          # room for one again
        assert h.status().filters == 256
    st = helper_status()
    assert (st["filters"], st["owner"]) == (0, 0), st
