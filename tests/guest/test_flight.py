"""The flight recorder across real crashes (tests/guest/flight_boot.py made
them, one boot each, and saved what `mmiotrace-ng recover` printed after
each reboot).  The truth is the exerciser's own sequence: COUNT writes of
EDU_CRASH_BASE + i to BAR0 + 4 on CPU 1, then the
death.  Only in the flight boot (marker flight_boot)."""

from __future__ import annotations

import re
import subprocess

import pytest
from flight_boot import COUNT, CPU, CRASHES, FLIGHT, NG, RECS
from kernel_tracer import find_pci_device

pytestmark = pytest.mark.flight_boot

EDU_CRASH_BASE = 0xF1000000
RECOVERED = [name for name in CRASHES if name != "sync"]   # the flight recorder's
W_LINE = re.compile(r"^W 4 \d+\.\d{6} (\d+) (0x[0-9a-f]+) (0x[0-9a-f]+) 0x0 0$")
DIED = re.compile(r"^MARK \d+\.\d{6} mmiotrace-ng recover: the machine died on CPU (-?\d+): "
                  r"(.*)$")
CONSOLE = re.compile(r"mmiotng: flight (\d+) (\d+) W 4 (0x[0-9a-f]+) (0x[0-9a-f]+) ")
# what each death is called, and the kernel's words in it
WHY = {
    "panic": ("panic", "edu_exerciser: panic after 5000 writes"),
    "oops": ("oops", "edu_crash_write"),
    "lockup": ("lockup (RCU stall)", "RCU Stall"),
}


def expected_values(name: str) -> list[int]:
    return [EDU_CRASH_BASE + i for i in range(COUNT - RECS, COUNT)]


@pytest.fixture(scope="module")
def live_reg() -> int:
    dev = find_pci_device(0x1234, 0x11E8)
    assert dev is not None
    return dev.bars[0][0] + 4


@pytest.mark.parametrize("name", RECOVERED)
def test_recover_prints_the_last_accesses_exactly(name, live_reg):
    err = (FLIGHT / f"{name}.err").read_text()
    assert err.startswith("exit 0\n"), err
    text = (FLIGHT / f"{name}.txt").read_text()
    lines = text.splitlines()
    assert lines[0] == "VERSION 20070824", lines[:3]
    assert any(line.startswith("PCIDEV ") for line in lines)
    writes = [m for m in map(W_LINE.match, lines) if m]
    values = [int(m[3], 16) for m in writes if int(m[2], 16) == live_reg]
    # every access kept is one of the sequence's last RECS, all of them, in order
    assert values == expected_values(name), (len(values), values[:3], values[-3:])
    # the CPU they came from is said before them
    first = next(i for i, line in enumerate(lines) if W_LINE.match(line))
    cpus = [line for line in lines[:first] if " mmiotrace-ng recover: CPU " in line]
    assert cpus and cpus[-1].endswith(f" mmiotrace-ng recover: CPU {CPU}"), lines[:first]
    # and their mapping's MAP line comes before them, with the BAR's address
    maps = [line for line in lines[:first] if line.startswith("MAP ")]
    assert maps and int(maps[0].split()[3], 16) == live_reg - 4, maps


@pytest.mark.parametrize("name", RECOVERED)
def test_recover_says_why_and_where_the_machine_died(name):
    lines = (FLIGHT / f"{name}.txt").read_text().splitlines()
    died = [m for m in map(DIED.match, lines) if m]
    assert len(died) == 1 and lines[-1] == died[0][0], lines[-3:]
    kind, words = WHY[name]
    assert died[0][2].startswith(kind + ":"), died[0][2]
    assert words in died[0][2], died[0][2]
    if name in ("panic", "oops"):
        assert int(died[0][1]) == CPU       # it died where it wrote
    assert f"the machine crashed on CPU {died[0][1]}" in (FLIGHT / f"{name}.err").read_text()


@pytest.mark.parametrize("name", RECOVERED)
def test_recover_recording_reports_the_same_text(name):
    out = subprocess.run([*NG, "report", str(FLIGHT / f"{name}.rec")], check=True,
                         capture_output=True, text=True).stdout
    assert out == (FLIGHT / f"{name}.txt").read_text()


@pytest.mark.parametrize("name", RECOVERED)
def test_the_console_tail_reached_ramoops(name, live_reg):
    """The dying kernel printed the newest records; ramoops kept its log."""
    dump = (FLIGHT / f"{name}.pstore").read_text()
    tail = [m for m in map(CONSOLE.finditer, dump.splitlines()) for m in m]
    mine = [int(m[4], 16) for m in tail if int(m[1]) == CPU and int(m[3], 16) == live_reg]
    assert mine, dump[-2000:]
    # the newest records of CPU 1 are the sequence's last writes
    assert mine == expected_values(name)[-len(mine):], mine


def test_sync_kept_every_access_the_loop_saw_complete(live_reg):
    """--sync: QEMU quit in the middle of a loop whose every turn writes i
    to BAR0 + 0x80 (one traced writel, from a task that may sleep there),
    every 16th then i to a file: the trace file holds every write up to the
    last i the loop wrote down (the bound for such accesses: none missing).
    Without --sync the loop outruns the tracer and this fails
    (NG_SYNC_OPTION= in flight_boot.py)."""
    count = int((FLIGHT / "sync.count").read_text().split()[0])
    assert count > 10, count                 # the loop ran (SYNC_SECONDS)
    text = (FLIGHT / "sync.txt").read_text()
    dma_src = live_reg - 4 + 0x80
    values = [int(m[3], 16) for m in map(W_LINE.match, text.splitlines())
              if m and int(m[2], 16) == dma_src]
    missing = sorted(set(range(1, count + 1)) - set(values))
    assert not missing, (count, missing[:10], len(missing))
    # and nothing the loop did not do; at most the writes after the last count
    assert values == list(range(1, len(values) + 1)) and len(values) <= count + 16, values[-3:]
