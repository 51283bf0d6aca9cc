"""Recordings for mmiotrace-ng diff, made in the guest and compared on the
host (tests/recorded/test_recording_diff.py, where a diff takes a second,
not half a minute): two runs of the same exerciser scenarios and one with
a changed write; polls of 300 and 301 reads; two loads of e1000, in one
boot and in another; the kernel tracer's text and recordings of the same
scenarios."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from kernel_tracer import capture, find_pci_device
from ng_tracer import RECORDED, recorded_for_host

from mmiotrace_ng.format.rawfile import open_recording

RUN = Path("/sys/kernel/debug/edu_exerciser/run")
E1000_ID = (0x8086, 0x100E)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def recorded(name: str, dev, cmd: list[str]) -> None:
    """A recording of dev (the exerciser's or a PciDevice) while cmd runs,
    for the host."""
    dev = getattr(dev, "dev", dev)
    recorded_for_host(name, ["record", "--pci", dev.name, "-o", "{rec}", "--", *cmd],
                      bdf=dev.name, bar0=dev.bars[0][0])


def scenarios(value: int) -> list[str]:
    steps = ["readl", "rmw", f"wval {value}", "writel", "wloop 50", "readl"]
    return ["sh", "-c", "; ".join(f"echo '{s}' > {RUN}" for s in steps)]


def test_two_runs_and_one_with_a_changed_write_are_recorded(exerciser):
    for name, value in (("diff-a", 5), ("diff-b", 5), ("diff-c", 6)):
        recorded(name, exerciser, scenarios(value))


def test_polls_of_300_and_301_reads_are_recorded(exerciser):
    for n in (300, 301):
        recorded(f"diff-rloop{n}", exerciser, ["sh", "-c", f"echo 'rloop {n}' > {RUN}"])


def e1000_loads(names: list[str]) -> None:
    """A recording of a load and unload of e1000 for each name, after a first
    load and unload (the first load after boot reads other values)."""
    dev = find_pci_device(*E1000_ID)
    assert dev is not None, "boot the VM with --qemu '-device e1000,...'"
    subprocess.run(["rmmod", "e1000"], capture_output=True)
    subprocess.run(["modprobe", "e1000"], check=True)
    subprocess.run(["rmmod", "e1000"], check=True)
    for name in names:
        recorded(name, dev, ["sh", "-c", "sleep 2; modprobe e1000; sleep 1; rmmod e1000"])


def test_two_loads_of_e1000_are_recorded():
    """(The first is also what the second boot's is compared with.)"""
    e1000_loads(["diff-e1000-1", "diff-e1000-2"])
    # e1000 came and went during each recording: its symbols are in anyway
    syms = open_recording(str(RECORDED / "diff-e1000-1.rec")).kallsyms
    assert "e1000_probe\t[e1000]" in syms, "e1000's symbols missing from the recording"


def test_the_kernel_tracers_text_and_recordings_of_the_same_scenarios(exerciser):
    """The same scenarios under the kernel's mmiotrace (its trace_pipe text)
    and recorded by mmiotrace-ng, in the same boot; and a recording of them
    with one write changed."""
    steps = scenarios(5)
    unmaps = len(steps[2].split(";"))
    kernel = capture(lambda: subprocess.run(steps, check=True),
                     until=lambda text: text.count("\nUNMAP ") >= unmaps, quiet=2.0,
                     timeout=300)
    (RECORDED / "diff-kernel.txt").write_text(kernel)
    recorded("diff-k", exerciser, steps)
    recorded("diff-k6", exerciser, scenarios(6))


@pytest.mark.second_boot
def test_e1000_in_another_boot_is_recorded():
    """In tests/run's second guest, another boot of the same machine: a load
    of e1000 recorded here, for the host to compare with the first boot's
    (recorded by test_two_loads_of_e1000_are_recorded)."""
    first = RECORDED / "diff-e1000-1.rec"
    assert first.exists(), f"{first} is missing: the first guest's e1000 test makes it"
    rec = open_recording(str(first))
    assert rec.meta["boot_id"] != BOOT_ID.read_text().strip(), f"{first} is of this boot"
    assert time.time() - rec.meta["started"] < 3 * 3600, f"{first} is stale"
    ids = f"{E1000_ID[0]:04x}{E1000_ID[1]:04x}"
    (pcidev,) = [ln.split() for ln in rec.header.splitlines()
                 if ln.startswith("PCIDEV ") and ln.split()[2] == ids]
    bar0 = int(pcidev[4], 16) & ~0xF
    dev = find_pci_device(*E1000_ID)
    if dev.bars[0][0] != bar0:
        # the first boot's hot-plug test (test_all.py) removed the NIC and
        # rescanned the bus, which gave it other addresses: the same here
        Path(f"/sys/bus/pci/devices/{dev.name}/remove").write_text("1")
        Path("/sys/bus/pci/rescan").write_text("1")
        dev = find_pci_device(*E1000_ID)
    assert dev.bars[0][0] == bar0, f"e1000's BAR 0 is at {dev.bars[0][0]:#x}, not {bar0:#x}"
    e1000_loads(["diff-e1000-boot2"])
