"""A mapping of edu's BAR0 held open by the exerciser, and the page-table
check built on it: the checks that do not take the helper's word.

The exerciser's "hold" file maps BAR0 ("map"), touches every page of it
("touch") and unmaps it ("unmap"); reading it gives the mapping's address,
its page count and how many of its pages are present in the kernel's page
table (lookup_address()).  A traced mapping has none present; after the
tracer is gone all must be, and the driver must keep using the mapping with
the helper unloaded (a page left not-present would fault with no handler).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from conftest import EXERCISER_DEBUGFS, REPO
from ng_tracer import helper_status

HOLD = EXERCISER_DEBUGFS / "hold"
HELPER_KO = REPO / "kmod" / "mmiotng.ko"


def hold(cmd: str) -> None:
    fd = os.open(HOLD, os.O_WRONLY)
    try:
        assert os.write(fd, cmd.encode()) == len(cmd)
    finally:
        os.close(fd)


def held_pages() -> tuple[int, int, int]:
    """(virt, pages, present) of the exerciser's held mapping."""
    m = re.fullmatch(r"virt 0x([0-9a-f]+) pages (\d+) present (\d+)\n", HOLD.read_text())
    assert m, HOLD.read_text()
    return int(m[1], 16), int(m[2]), int(m[3])


def ensure_helper() -> None:
    if not Path("/sys/module/mmiotng").exists():
        subprocess.run(["insmod", str(HELPER_KO)], check=True)


def rmmod_helper() -> None:
    res = subprocess.run(["rmmod", "mmiotng"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"rmmod mmiotng refused: {res.stderr.strip()}"
    assert not Path("/sys/module/mmiotng").exists()


def wait_whole(timeout: float = 10) -> None:
    """Every page of the held mapping present in the page table (within
    timeout): what a tracer must leave when it goes, however it goes."""
    _virt, pages, present = held_pages()
    deadline = time.monotonic() + timeout
    while present != pages and time.monotonic() < deadline:
        time.sleep(0.1)
        present = held_pages()[2]
    assert present == pages, f"{pages - present} of {pages} pages left not-present"


def wait_armed(timeout: float = 300) -> None:
    """Until no page of the held mapping is present (a tracer armed it)."""
    deadline = time.monotonic() + timeout
    while held_pages()[2] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held_pages()[2] == 0, "the held mapping was not armed"


def arm_held(h, start: int) -> None:
    """ARM_EXISTING of the held mapping through h (a netlink HelperSocket
    whose filter covers it), as the CLI arms a mapping made before it: no
    page of it is present afterwards."""
    virt, pages, _present = held_pages()
    h.arm_existing(virt, pages * 4096, start)
    assert held_pages()[2] == 0, "the held mapping was not armed"


def assert_left_whole(exerciser, timeout: float = 10) -> None:
    """After a tracer has gone (however it went): every page of the held
    mapping is present again, using the device makes the helper take no
    fault, the helper unloads, and the mapping works without it."""
    virt, pages, _present = held_pages()
    wait_whole(timeout)
    before = helper_status()["faults"]
    hold("touch")
    exerciser.run("readl")
    assert helper_status()["faults"] == before, "the helper took faults with nothing traced"
    rmmod_helper()
    hold("touch")            # a page left not-present would oops here
    exerciser.run("readl")
    assert held_pages() == (virt, pages, pages)
    ensure_helper()
