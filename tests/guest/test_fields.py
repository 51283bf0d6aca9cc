"""Fields and options checked against what the kernel says, not what the
tracer says: --pc against /proc/kallsyms, --pid against the process that
made the access, map ids against their open/close rules, --no-existing
against a mapping held open from before the start."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import EXERCISER_DEBUGFS
from held import held_pages, hold
from kernel_tracer import map_id_problems
from ng_tracer import NgTracer
from test_engine_safety import stress

RW = re.compile(r"^(R|W) (\d+) \S+ (-?\d+) (0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+) (\d+)$")


def kallsyms() -> list[tuple[int, str, str]]:
    """(address, name, module) of every text symbol, sorted."""
    out = []
    for line in Path("/proc/kallsyms").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in "tT":
            mod = parts[3].strip("[]") if len(parts) > 3 else ""
            out.append((int(parts[0], 16), parts[2], mod))
    out.sort()
    assert out and out[0][0] != 0, "kallsyms shows no addresses (kptr_restrict?)"
    return out


def symbol_of(syms: list[tuple[int, str, str]], pc: int) -> tuple[str, str]:
    best = ("?", "?")
    for addr, name, mod in syms:
        if addr > pc:
            break
        best = (name, mod)
    return best


def run_scenario_in_child(name: str) -> int:
    """Run an exerciser scenario from a child shell; its pid."""
    p = subprocess.Popen(["sh", "-c", f"echo {name} > {EXERCISER_DEBUGFS / 'run'}"])
    assert p.wait(60) == 0
    return p.pid


def test_pc_and_pid_name_the_code_and_process_that_accessed(exerciser):
    t = NgTracer(["--pci", exerciser.dev.name, "--pc", "--pid"], "ng-fields").start()
    try:
        pids = {}
        text = t.section(lambda: pids.setdefault("readl", run_scenario_in_child("readl")))
    finally:
        assert t.stop() == 0, t.stderr()
    syms = kallsyms()
    rws = [m.groups() for ln in text.splitlines() if (m := RW.match(ln))]
    assert len(rws) == 4, text
    for op, _w, _mid, _phys, _val, pc, pid in rws:
        assert op == "R"
        assert int(pid) == pids["readl"], f"pid {pid}, the writer was {pids['readl']}"
        assert symbol_of(syms, int(pc, 16)) == ("sc_readl", "edu_exerciser"), pc
    assert map_id_problems(t.text()) == []


def test_pc_is_the_address_of_the_access_instruction(exerciser):
    """--pc of a write and a read: the addresses of the two instructions,
    exactly, as the exerciser took them with labels (one instruction off
    would be in the same function and pass the test above)."""
    t = NgTracer(["--pci", exerciser.dev.name, "--pc"], "ng-pc").start()
    try:
        text = t.section(lambda: stress("pc"))
    finally:
        assert t.stop() == 0, t.stderr()
    want = [("W", int((EXERCISER_DEBUGFS / "pc_write").read_text(), 16)),
            ("R", int((EXERCISER_DEBUGFS / "pc_read").read_text(), 16))]
    assert want[0][1] and want[1][1] > want[0][1], want
    got = [(op, int(pc, 16)) for ln in text.splitlines() if (m := RW.match(ln))
           for op, pc in [(m[1], m[6])]]
    assert got == want, [(op, hex(pc)) for op, pc in got + want]


def test_without_pc_and_pid_both_are_zero(exerciser):
    t = NgTracer(["--pci", exerciser.dev.name], "ng-nofields").start()
    try:
        text = t.section(lambda: run_scenario_in_child("readl"))
    finally:
        assert t.stop() == 0, t.stderr()
    rws = [m.groups() for ln in text.splitlines() if (m := RW.match(ln))]
    assert len(rws) == 4 and {(r[5], r[6]) for r in rws} == {("0x0", "0")}, text


def test_no_existing_leaves_a_held_mapping_alone(exerciser):
    """--no-existing: a mapping made before the start is not traced (its
    pages stay present, its accesses are not in the trace); a new mapping
    is."""
    hold("map")
    try:
        t = NgTracer(["--pci", exerciser.dev.name, "--no-existing"], "ng-no-existing").start()
        try:
            _virt, pages, present = held_pages()
            assert present == pages, f"{pages - present} pages of the held mapping armed"
            untraced = t.section(lambda: hold("touch"))
            traced = t.section(lambda: exerciser.run("readl"))
        finally:
            assert t.stop() == 0, t.stderr()
    finally:
        hold("unmap")
    assert not [ln for ln in untraced.splitlines() if RW.match(ln)], untraced
    assert len([ln for ln in traced.splitlines() if RW.match(ln)]) == 4, traced
    head = t.text().split("ng-section-begin-1")[0]
    assert not [ln for ln in head.splitlines() if ln.startswith("MAP ")], head
