"""Checks that do not take the helper's word for it.

"Nothing is left armed" is read here from the kernel's page table (the
exerciser's "hold" file counts the present pages of a mapping it keeps
open, with lookup_address()) and from what happens when the helper is gone
and the driver goes on using the mapping: a page left not-present would
fault with no handler and oops.  The helper's own STATUS is used only for
its fault counter, which must not move while nothing is traced.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import EXERCISER_DEBUGFS
from held import HOLD, assert_left_whole, held_pages, hold
from ng_tracer import NG, NgTracer, helper_status


@pytest.mark.parametrize("when", ["before-start", "after-start"])
def test_killed_tracer_leaves_the_page_table_whole(held, when):
    """A mapping held open across SIGKILL of the tracer: while tracing, its
    pages are not present in the page table (so the check below can see an
    armed page); after the kill every page is present again, the helper
    unloads, and the driver keeps using the mapping without it."""
    if when == "before-start":
        hold("map")          # armed by ARM_EXISTING
    t = NgTracer(["--pci", held.dev.name], f"truth-kill-{when}").start()
    try:
        if when == "after-start":
            hold("map")      # armed by the ioremap probe
        virt, pages, present = held_pages()
        assert pages == held.bar0[1] // 4096
        assert present == 0, f"{present} of {pages} pages present while traced"
        text = t.section(lambda: hold("touch"))
        ident = rf"^R 4 \S+ \d+ 0x{held.bar0[0]:x} 0x10000ed "
        assert re.search(ident, text, re.M), f"the touch was not traced:\n{text}"
        t.proc.send_signal(signal.SIGKILL)
        t.proc.wait(30)
    finally:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait(30)
    # the helper disarms when the killed tracer's socket is released
    assert held_pages()[0] == virt
    assert_left_whole(held)


def test_untraced_device_takes_no_fault(held):
    """With no session, edu's mappings never fault into the helper,
    whatever the driver does, and its held mapping stays present."""
    hold("map")
    before = helper_status()["faults"]
    for name, count in (("readl", None), ("writel", None), ("toio", None), ("burst", 50)):
        held.run(name, count)
        hold("touch")
    assert helper_status()["faults"] == before
    assert held_pages()[2] == held_pages()[1]


def test_plain_run_stderr_and_render_of_a_preexisting_mapping(held, tmp_path):
    """A plain run around a scenario, with a mapping held from before the
    start: stderr is the progress line, `ready` and the summary, nothing
    else; `render` of its --raw file is the printed trace byte for byte,
    the pre-existing mapping's MAP and accesses included."""
    hold("map")
    out, raw = tmp_path / "plain.txt", tmp_path / "plain.raw"
    cmd = f"echo touch > {HOLD} && echo readl > {EXERCISER_DEBUGFS / 'run'}"
    res = subprocess.run([*NG, "--pci", held.dev.name, "-o", str(out), "--raw", str(raw),
                          "--", "sh", "-c", cmd], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 3, res.stderr
    assert lines[0] == "mmiotrace-ng: loading and attaching the BPF programs ..."
    assert lines[1] == f"mmiotrace-ng: ready, tracing {held.dev.name}"
    assert re.fullmatch(r"mmiotrace-ng: \d+ records \(map 2, unmap 1, access \d+, mark 0\), "
                        r"lost 0", lines[2]), lines[2]
    text = out.read_bytes()
    virt = held_pages()[0]
    assert f" 0x{held.bar0[0]:x} 0x{virt:x} ".encode() in text    # the held mapping's MAP
    rendered = subprocess.run([*NG, "render", str(raw)], capture_output=True, check=True)
    assert rendered.stdout == text


def test_kptr_restrict_2_is_said_not_changed(held):
    """kernel.kptr_restrict=2 hides vmallocinfo's addresses even from root:
    the tracer leaves the sysctl alone, says that mappings made before the
    start are not traced, and leaves the held mapping present."""
    sysctl = Path("/proc/sys/kernel/kptr_restrict")
    saved = sysctl.read_text()
    hold("map")
    sysctl.write_text("2\n")
    try:
        t = NgTracer(["--pci", held.dev.name], "ng-kptr2").start()
        try:
            assert sysctl.read_text().strip() == "2"
            pages = held_pages()
            assert pages[2] == pages[1], f"the held mapping was armed: {pages}"
        finally:
            assert t.stop() == 0, t.stderr()
    finally:
        sysctl.write_text(saved)
    assert "kernel.kptr_restrict hides the addresses" in t.stderr()
    assert "NOT traced" not in t.stderr()
