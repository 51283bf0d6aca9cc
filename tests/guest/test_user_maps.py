"""With --no-user, a traced BAR mapped into a process is said, not traced
(test_user_trace.py: traced, the default), and not left unmentioned: edu's
BAR0 mapped through its sysfs resource0 file by a process of its own (no
driver bound: a driver's claim refuses such mappings), while tracing and
before the start.  The process prints its pid, the address mmap gave it
and edu's identification register read there; the trace (live text, its
recording) and the tracer's stderr must name that process and address,
and the register must read as untraced (the mapping is not armed)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EDU_ID, _rmmod
from kernel_tracer import find_pci_device
from ng_tracer import ARTIFACTS, NG, NgTracer

EDU_IDENT = 0x010000ED      # edu's register 0x00 (QEMU's hw/misc/edu.c)
MAPPER = r"""
import ctypes, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_SYNC)
mm = mmap.mmap(fd, 4096)
os.close(fd)
word = ctypes.c_uint32.from_buffer(mm, 0)
print(os.getpid(), hex(ctypes.addressof(word)), hex(word.value), flush=True)
sys.stdin.readline()        # holds the mapping until told
del word
mm.close()
"""


@pytest.fixture
def edu() -> Iterator[Path]:
    """edu's sysfs directory, with no driver bound."""
    dev = find_pci_device(*EDU_ID)
    assert dev is not None, "boot the test VM with QEMU's edu device"
    _rmmod("edu_exerciser")
    sysdev = Path("/sys/bus/pci/devices") / dev.name
    assert not (sysdev / "driver").exists(), "edu has a driver bound"
    yield sysdev


class Mapper:
    """A process holding edu's BAR0 mapped (MAPPER) until stop()."""

    def __init__(self, sysdev: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", MAPPER, str(sysdev / "resource0")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        pid, self.addr, ident = self.proc.stdout.readline().split()
        self.pid = int(pid)
        assert self.pid == self.proc.pid
        assert int(ident, 16) == EDU_IDENT

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.wait(30) == 0


def said(sysdev: Path, m: Mapper) -> str:
    bar0 = int((sysdev / "resource").read_text().split()[0], 16)
    return (f"mmiotrace-ng: the range {bar0:#x} size 0x1000 is mapped into process {m.pid} "
            f"at {m.addr}: its accesses from user space are NOT traced")


def marks(text: str) -> list[str]:
    return [line.split(" ", 2)[2] for line in text.splitlines() if line.startswith("MARK ")]


def test_a_mapping_made_while_tracing_is_said_in_the_trace_and_its_recording(edu):
    ng = NgTracer(["--pci", edu.name, "--no-user"], "user-map-while").start()
    try:
        m = Mapper(edu)
        m.stop()
        line = said(edu, m)
        text = ng.wait_for(line)
    finally:
        assert ng.stop() == 0
    assert marks(text).count(line) == 1, text
    assert line in ng.stderr()
    report = ARTIFACTS / "user-map-while.report.txt"
    res = subprocess.run([*NG, "report", str(ng.raw), "-o", str(report)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert marks(report.read_text()).count(line) == 1


def test_a_mapping_made_before_the_start_is_said_once_at_the_start(edu):
    m = Mapper(edu)
    try:
        ng = NgTracer(["--pci", edu.name, "--no-user"], "user-map-before").start()
        try:
            line = said(edu, m)
            text = ng.wait_for(line)
        finally:
            assert ng.stop() == 0
    finally:
        m.stop()
    assert marks(text) == [line], text
