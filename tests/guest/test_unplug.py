"""A traced device that goes away (sysfs remove, as a hot-unplug), and a
traced BAR that moves.  This file runs last of the guest tests: the rescan
and the move change where edu's BAR0 is.

The filters in its BARs go with it: the trace says so, and whatever maps
the range next (here the same device, found again by a rescan, with its
driver bound anew) is not armed under a filter the session made for a
device that no longer exists.  (Under QEMU's q35 the rescan gives edu's
BAR0 another address: the old range is free for whatever comes next.)
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from conftest import EDU_ID, EXERCISER_DEBUGFS
from held import ensure_helper, held_pages, hold
from kernel_tracer import find_pci_device, to_records
from ng_tracer import NgTracer, helper_status

RESCAN = Path("/sys/bus/pci/rescan")


def _rescan(name: str, timeout: float = 60) -> None:
    """Rescan the bus until the device is back and its driver bound."""
    deadline = time.monotonic() + timeout
    while not (EXERCISER_DEBUGFS / "hold").exists():
        assert time.monotonic() < deadline, f"{name} did not come back"
        if not Path(f"/sys/bus/pci/devices/{name}").exists():
            RESCAN.write_text("1\n")
        time.sleep(0.2)


def test_a_removed_device_takes_its_filters_with_it(held):
    ensure_helper()
    name = held.dev.name
    start, length = held.bar0
    hold("map")
    t = NgTracer(["--pci", name], "ng-removed").start()
    try:
        assert held_pages()[2] == 0, "the held mapping is not armed"
        Path(f"/sys/bus/pci/devices/{name}/remove").write_text("1\n")
        gone = helper_status()
        _rescan(name)
        back = find_pci_device(*EDU_ID)
        hold("map")                       # the driver bound anew maps BAR0
        hold("touch")
        _, pages, present = held_pages()
        after = helper_status()
    finally:
        _rescan(name)
        status = t.stop()
    assert status == 0, t.stderr()
    assert back is not None, "no edu device after the rescan"
    print(f"BAR0 was at 0x{start:x}, is at 0x{back.bars[0][0]:x} after the rescan")
    assert (gone["filters"], gone["mappings"], gone["armed_pages"]) == (0, 0, 0), gone
    assert present == pages, f"{pages - present} pages of the new mapping armed"
    assert after["armed_pages"] == 0, after
    want = (f"mmiotrace-ng: the range 0x{start:x} size 0x{length:x} is NOT traced any more: "
            "the device was removed")
    marks = re.findall(r"^MARK \S+ (.*)$", t.text(), re.M)
    assert want in marks, marks
    assert want in t.stderr(), t.stderr()


def moved_mark(start: int, length: int, new: int) -> str:
    return (f"mmiotrace-ng: the range 0x{start:x} size 0x{length:x} is NOT traced any more: "
            f"its BAR was moved (resized or reassigned) to 0x{new:x}, which is traced from "
            "here on")


def touched(text: str, base: int, length: int) -> list[tuple]:
    """The records of one "map; touch; unmap" of edu's BAR0 at base."""
    recs = [r for r in to_records(text, base) if r[0] in ("MAP", "R", "W") and
            (r[0] != "MAP" or r[1:] == (0, length))]
    return recs


TOUCH = [("R", 4, 0x00, 0x010000ED), ("W", 4, 0x04, 0x12345678), ("R", 4, 0x04, 0xEDCBA987)]


def test_a_bar_that_moves_is_followed(held):
    """edu's BAR0 moved while traced, as a driver that resizes its BAR in
    its probe moves it (released, assigned anew elsewhere): the trace says
    so, and the driver's mapping of the new range is traced, its accesses
    with it (it used to be left untraced without a word).  Then put back
    as the kernel undoes a resize that failed (released, claimed at its
    old range): followed back."""
    dev = find_pci_device(*EDU_ID)
    start, length = dev.bars[0]
    t = NgTracer(["--pci", dev.name], "ng-moved").start()
    try:
        hold("move")
        moved = find_pci_device(*EDU_ID)
        text_moved = t.section(lambda: [hold(c) for c in ("map", "touch", "unmap")])
        hold("moveback")
        back = find_pci_device(*EDU_ID)
        text_back = t.section(lambda: [hold(c) for c in ("map", "touch", "unmap")])
        after = helper_status()
    finally:
        status = t.stop()
    assert status == 0, t.stderr()
    new, new_length = moved.bars[0]
    print(f"BAR0 moved from 0x{start:x} to 0x{new:x}, back to 0x{back.bars[0][0]:x}")
    assert new != start and new_length == length and back.bars[0] == (start, length)
    marks = re.findall(r"^MARK \S+ (.*)$", t.text(), re.M)
    there, home = moved_mark(start, length, new), moved_mark(new, length, start)
    assert [m for m in marks if "moved" in m] == [there, home], marks
    assert there in t.stderr() and home in t.stderr(), t.stderr()
    assert touched(text_moved, new, length) == [("MAP", 0, length), *TOUCH], text_moved
    assert touched(text_back, start, length) == [("MAP", 0, length), *TOUCH], text_back
    assert (after["filters"], after["armed_pages"]) == (1, 0), after
