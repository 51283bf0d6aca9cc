"""The kernel's switches that turn the helper's hooks off.

- sysctl kernel.ftrace_enabled=0 would unpatch the fault hook
  (bad_area_nosemaphore) under armed pages: the next traced access would
  oops.  It must be refused while the helper is loaded, and the helper must
  refuse to load while it is 0, with one clear line from the tracer.
- /sys/kernel/debug/kprobes/enabled=0 silences the ioremap and iounmap
  probes: a mapping unmapped then is not seen.  The trace must stop with a
  message (stderr and the stream), nothing may stay armed (read from the
  page table), and no page-table entry may be written into the freed range.
"""

from __future__ import annotations

import errno
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import EXERCISER_DEBUGFS
from held import HELPER_KO, assert_left_whole, ensure_helper, held_pages, hold, rmmod_helper
from ng_tracer import NG, NgTracer, helper_status

FTRACE_ENABLED = Path("/proc/sys/kernel/ftrace_enabled")
KPROBES_ENABLED = Path("/sys/kernel/debug/kprobes/enabled")
HELD_LAST = EXERCISER_DEBUGFS / "held_last"
PROBES_OFF = "kprobes are disabled"


def _set(path: Path, value: str) -> None:
    path.write_text(value + "\n")


@pytest.fixture
def switches():
    """Both switches on after the test, whatever it did."""
    yield
    for path in (KPROBES_ENABLED, FTRACE_ENABLED):
        if path.read_text().strip() != "1":
            _set(path, "1")


def _held_last() -> tuple[int, int, int]:
    m = re.fullmatch(r"virt 0x([0-9a-f]+) pages (\d+) present (\d+)\n", HELD_LAST.read_text())
    assert m, HELD_LAST.read_text()
    return int(m[1], 16), int(m[2]), int(m[3])


def test_ftrace_enabled_0_is_refused_while_tracing(held, switches):
    """While the helper is loaded (here: tracing an armed mapping) the fault
    hook cannot be unpatched: the sysctl write fails with EBUSY."""
    hold("map")
    t = NgTracer(["--pci", held.dev.name], "switch-ftrace").start()
    try:
        assert held_pages()[2] == 0, "the held mapping is not armed"
        try:
            _set(FTRACE_ENABLED, "0")
        except OSError as exc:
            assert exc.errno == errno.EBUSY, exc
        else:
            _set(FTRACE_ENABLED, "1")     # before any access to the armed pages
            pytest.fail("kernel.ftrace_enabled=0 was accepted under armed pages")
        assert FTRACE_ENABLED.read_text().strip() == "1"
        text = t.section(lambda: hold("touch"))
        assert re.search(rf"^R 4 \S+ \d+ 0x{held.bar0[0]:x} 0x10000ed ", text, re.M), text
    finally:
        assert t.stop() == 0, t.stderr()
    assert_left_whole(held)


def test_helper_refuses_to_load_while_ftrace_is_disabled(held, switches):
    """With ftrace_enabled=0 the helper does not load (it could never take a
    fault) and the tracer says why in one line, exit status 2."""
    rmmod_helper()
    _set(FTRACE_ENABLED, "0")
    try:
        res = subprocess.run(["insmod", str(HELPER_KO)], capture_output=True, text=True)
        assert res.returncode != 0, "the helper loaded with ftrace disabled"
        res = subprocess.run([*NG, "--pci", held.dev.name, "--", "true"],
                             capture_output=True, text=True, timeout=600)
    finally:
        _set(FTRACE_ENABLED, "1")
        subprocess.run(["rmmod", "mmiotng"], capture_output=True)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert "kernel.ftrace_enabled" in res.stderr, res.stderr
    ensure_helper()


def _stops_by_itself(t: NgTracer, timeout: float = 20) -> int | None:
    """The tracer's exit status if it exits within timeout, else None."""
    assert t.proc is not None
    try:
        return t.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.parametrize("unmap", [False, True], ids=["held", "unmapped-meanwhile"])
def test_kprobes_disabled_stop_the_trace(held, switches, unmap):
    """kprobes disabled during a trace: the tracer stops by itself, says
    so on stderr and in the stream, and leaves nothing armed: the held
    mapping is present again in the page table; a mapping unmapped while
    the probes were off is still seen (the iounmap hook is an ftrace ops,
    which the kprobes switch does not turn off): it is disarmed as it goes,
    and no entry is written into its freed range."""
    hold("map")
    stale = helper_status().get("stale", 0)
    t = NgTracer(["--pci", held.dev.name], f"switch-kprobes-{int(unmap)}").start()
    try:
        assert held_pages()[2] == 0, "the held mapping is not armed"
        _set(KPROBES_ENABLED, "0")
        if unmap:
            hold("unmap")                 # seen by the iounmap hook all the same
        status = _stops_by_itself(t)
    finally:
        if t.proc.poll() is None:
            t.proc.send_signal(signal.SIGINT)
            t.proc.wait(60)
    # (no access to the device before the checks: a page left armed may
    # have no handler any more)
    if unmap:
        virt, pages, present = _held_last()
        assert present == 0, (f"{present} of {pages} pages written back into the freed "
                              f"range at 0x{virt:x}")
    else:
        virt, pages, present = held_pages()
        assert present == pages, f"{pages - present} of {pages} pages left armed"
    assert status is not None, "the tracer went on with the kprobes disabled"
    assert status == 2, t.stderr()
    assert PROBES_OFF in t.stderr(), t.stderr()
    assert re.search(rf"^MARK .*{PROBES_OFF}", t.text(), re.M), t.text()[-2000:]
    st = helper_status()
    assert (st["armed_pages"], st["mappings"], st["filters"], st["owner"]) == (0, 0, 0, 0), st
    _set(KPROBES_ENABLED, "1")
    if unmap:
        # disarmed at its iounmap: no entry found changed at the end
        assert st["stale"] == stale, st
    else:
        assert_left_whole(held)


def test_tracing_refused_while_kprobes_are_disabled(held, switches):
    """A session cannot start while kprobes are disabled: exit status 2
    and why, nothing armed."""
    ensure_helper()
    hold("map")
    _set(KPROBES_ENABLED, "0")
    try:
        res = subprocess.run([*NG, "--pci", held.dev.name, "--", "true"],
                             capture_output=True, text=True, timeout=600)
        pages = held_pages()
    finally:
        _set(KPROBES_ENABLED, "1")
    assert res.returncode == 2, res.stderr
    assert PROBES_OFF in res.stderr, res.stderr
    assert pages[2] == pages[1], pages
