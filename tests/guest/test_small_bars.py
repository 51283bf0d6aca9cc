"""BARs smaller than a page: traced like any other, compared with the kernel's
own mmiotrace on real in-tree drivers, in the same boot.

The test guest has QEMU's i6300esb watchdog (one 16-byte memory BAR, driver
i6300esb) and sdhci-pci (one 256-byte BAR, driver sdhci-pci), both kept from
loading at boot.  Each driver is loaded and unloaded under the kernel's
tracer, then under mmiotrace-ng --compat: the records of the device's BAR
must be the same, repeated reads counted one by one.  An exerciser scenario
maps a 16-byte window of the edu BAR on its own.  SeaBIOS gives each small
BAR a page of its own, so a test moves sdhci's into the page of ivshmem's
256-byte BAR to make a neighbour.
"""

from __future__ import annotations

import contextlib
import functools
import re
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_tracer import capture, find_pci_device, to_records
from ng_tracer import NgTracer, helper_status
from test_engine_safety import stress
from test_record import ivshmem_64m

DEVICES = {
    "i6300esb": ((0x8086, 0x25AB), 16),
    "sdhci_pci": ((0x1B36, 0x0007), 256),
}


def device(driver: str):
    ids, size = DEVICES[driver]
    dev = find_pci_device(*ids)
    assert dev is not None, f"boot the test VM with QEMU's {driver} device (tests/run)"
    assert dev.bars[0][1] == size, dev.bars
    return dev


def load_unload(driver: str) -> None:
    subprocess.run(["modprobe", driver], check=True)
    subprocess.run(["rmmod", driver], check=True)


def bar_records_by_task(text: str, start: int, size: int) -> list[tuple[tuple, int]]:
    """The records of one BAR, offsets from its start, each with the pid its
    line names (0 where the tracer prints none); repeated reads count one by
    one."""
    out: list[tuple[tuple, int]] = []
    for line in text.splitlines():
        for r in to_records(line, start):
            pid = int(line.split()[-1]) if r[0] in ("R", "W", "MAP", "UNKNOWN") else 0
            if r[0] in ("R", "W") and 0 <= r[2] < size:
                out.append((r, pid))
            elif r[0] in ("MAP", "UNKNOWN") and 0 <= r[1] < size:
                out.append((r, pid))
            elif r[0] in ("?", "LOST"):
                out.append((r, pid))
    return out


def bar_records(text: str, start: int, size: int) -> list[tuple]:
    """The records of one BAR, offsets from its start."""
    return [r for r, _pid in bar_records_by_task(text, start, size)]


def interleaves(whole: list[tuple], parts: list[list[tuple]]) -> bool:
    """Whether whole is an interleaving of parts: each part's records in
    their order, every record of whole used once."""
    @functools.cache
    def rest(pos: tuple[int, ...]) -> bool:
        done = sum(pos)
        if done == len(whole):
            return True
        return any(pos[i] < len(part) and part[pos[i]] == whole[done] and
                   rest(pos[:i] + (pos[i] + 1,) + pos[i + 1:])
                   for i, part in enumerate(parts))

    return sum(map(len, parts)) == len(whole) and rest((0,) * len(parts))


ATTEMPTS = 3


def compare_once(driver: str, start: int, size: int, name: str) -> str | None:
    """One load and unload under the kernel's tracer, one under
    mmiotrace-ng: None if the device's records agree, else why not."""
    kernel = capture(lambda: load_unload(driver), quiet=2.0, timeout=300)
    t = NgTracer(["--pci", name, "--compat", "--pid", "--", "sh", "-c",
                  f"modprobe {driver} && rmmod {driver}"], f"ng-{driver}")
    t.start()
    assert t.proc.wait(600) == 0, t.stderr()
    k, ours = bar_records(kernel, start, size), bar_records_by_task(t.text(), start, size)
    o = [r for r, _pid in ours]
    assert sum(r[0] in ("R", "W") for r in k) >= 2, k
    assert any(r[0] == "MAP" for r in o), o
    assert "NOT traced" not in t.text()
    if o == k:
        return None
    tasks = {pid: [r for r, p in ours if p == pid] for pid in dict.fromkeys(p for _, p in ours)}
    # a task that only read (an interrupt thread, a card-detect poll)
    # polls as often as the timing makes it: its reads may be more or
    # fewer than in the kernel's run on one CPU
    readers = [p for p, v in tasks.items() if all(r[0] == "R" for r in v)]
    if len(tasks) > 1 and any(interleaves(k, [v for p, v in tasks.items() if p not in drop])
                              for drop in ([], readers)):
        return None
    return "\n".join([f"{len(tasks)} tasks accessed the device: "
                      f"{ {p: len(v) for p, v in tasks.items()} }",
                      f"the kernel's: {k}",
                      *(f"task {pid}: {recs}" for pid, recs in tasks.items())])


@pytest.mark.parametrize("driver", list(DEVICES))
def test_small_bar_driver_matches_kernel(driver):
    """The device's records under mmiotrace-ng are the kernel tracer's.  The
    kernel's tracer runs the driver on one CPU; with every CPU online the
    accesses of another task (sdhci's card-detect work, an interrupt thread
    on PREEMPT_RT) can come at another point among the probe's: then each
    task's accesses must be the kernel's in the kernel's order, and the
    kernel's sequence an interleaving of them (of those of the tasks that
    wrote, if the reads of a task that only read differ in number).

    sdhci's card-detect work also runs a number of times that depends on the
    timing (a rescan that the removal may cancel or not), under either
    tracer: a load and unload whose records differ is done again, under
    both, up to ATTEMPTS times in all, and every difference is printed."""
    dev = device(driver)
    start, size = dev.bars[0]
    subprocess.run(["rmmod", driver], capture_output=True)
    load_unload(driver)             # the first load after boot finds another state
    diffs: list[str] = []
    while len(diffs) < ATTEMPTS and (why := compare_once(driver, start, size, dev.name)):
        diffs.append(why)
        print(f"attempt {len(diffs)}:", why)
    assert len(diffs) < ATTEMPTS, "\n".join(diffs)
    st = helper_status()
    assert st["armed_pages"] == 0 and st["filters"] == 0, st


def test_window_of_16_bytes(exerciser):
    """ioremap of 16 bytes inside the edu BAR: traced, every access once."""
    t = NgTracer(["--pci", exerciser.dev.name], "ng-window16").start()
    try:
        text = t.section(lambda: stress("window16"))
    finally:
        assert t.stop() == 0
    assert to_records(text, exerciser.bar0[0]) == [
        ("MAP", 0x80, 0x10),
        ("W", 8, 0x80, 0x0123456789ABCDEF), ("R", 8, 0x80, 0x0123456789ABCDEF),
        ("W", 4, 0x88, 0x5A5AA5A5), ("R", 4, 0x88, 0x5A5AA5A5),
        ("UNMAP",),
    ]


def test_mapping_it_cannot_trace_is_said(exerciser):
    """A mapping that only partly covers the traced BAR is NOT traced, and the
    tracer says so where it happened (a MARK line) and on stderr; its access
    is not reported, the driver reads the right value."""
    start, length = exerciser.bar0
    t = NgTracer(["--pci", exerciser.dev.name], "ng-straddle").start()
    try:
        text = t.section(lambda: stress("straddle"))
    finally:
        assert t.stop() == 0
    want = (f"mmiotrace-ng: ioremap of 0x{start + length - 4096:x} size 0x2000 at 0x")
    marks = [ln for ln in text.splitlines() if ln.startswith("MARK ") and "NOT traced" in ln]
    assert len(marks) == 1 and want in marks[0], text
    assert marks[0].endswith("is NOT traced: it is not inside one traced BAR")
    assert not [r for r in to_records(text, start) if r[0] in ("R", "W", "MAP")], text
    err = [ln for ln in t.stderr().splitlines() if ln.startswith("mmiotrace-ng: ioremap of")]
    assert len(err) == 1 and err[0] == marks[0].split(" ", 2)[2], err
    assert "1 mappings NOT traced" in t.stderr()


SDHCI_ARGUMENT = 0x08           # read/write in QEMU's sdhci: what is written reads back
PCI_COMMAND, PCI_COMMAND_MEMORY, PCI_BAR0 = 0x04, 0x02, 0x10
PCI_NAME = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def busy(start: int, size: int) -> bool:
    """Whether a PCI device's resource in /proc/iomem (a BAR, named by the
    device's address) overlaps [start, start + size); the bus windows
    around them do not count."""
    for line in Path("/proc/iomem").read_text().splitlines():
        span, name = (x.strip() for x in line.split(" : ", 1))
        lo, hi = (int(x, 16) for x in span.split("-"))
        if PCI_NAME.match(name) and lo < start + size and start <= hi:
            return True
    return False


@contextlib.contextmanager
def bar0_moved(dev, phys: int) -> Iterator[None]:
    """dev's BAR0 decoded at phys (its BAR register written, memory decoding
    on) while no driver is bound; put back as it was afterwards.  The
    kernel's resources keep the old place: nothing maps it meanwhile."""
    config = Path("/sys/bus/pci/devices") / dev.name / "config"
    assert not (config.parent / "driver").exists(), f"{dev.name} has a driver"
    with open(config, "r+b", buffering=0) as f:
        f.seek(PCI_COMMAND)
        (command,) = struct.unpack("<H", f.read(2))
        f.seek(PCI_BAR0)
        (bar0,) = struct.unpack("<I", f.read(4))
        try:
            f.seek(PCI_BAR0)
            f.write(struct.pack("<I", phys | (bar0 & 0xF)))
            f.seek(PCI_COMMAND)
            f.write(struct.pack("<H", command | PCI_COMMAND_MEMORY))
            yield
        finally:
            f.seek(PCI_BAR0)
            f.write(struct.pack("<I", bar0))
            f.seek(PCI_COMMAND)
            f.write(struct.pack("<H", command))


def test_a_neighbour_in_the_page_works_untraced(exerciser):
    """A 256-byte BAR traced (ivshmem's registers), and another device's
    registers in the rest of its page (sdhci's BAR0, moved there): reached
    through the traced mapping, the neighbour's register takes the value
    written and reads it back, both accesses trap (the helper emulates them),
    and neither is in the trace, while the traced BAR's own are."""
    iv = ivshmem_64m()
    start, size = iv.bars[0]
    assert size == 256, iv.bars
    # the next 256 bytes after the BAR in its page, where nothing else is
    # (the poke reaches from the BAR's start to its page's end)
    slot = start + size
    assert slot & 0xFFF and not busy(slot, 0x100), f"{slot:#x} is not free"
    sdhci = device("sdhci_pci")
    subprocess.run(["rmmod", "sdhci_pci"], capture_output=True)
    poke = Path("/sys/kernel/debug") / f"edu_exerciser-{iv.name}" / "poke"
    value = 0x5EC0_0D0D
    with bar0_moved(sdhci, slot):
        # untraced first: the neighbour answers there
        poke.write_text(f"0 {slot - start + SDHCI_ARGUMENT:#x} {value:#x}\n")
        t = NgTracer(["--pci", f"{iv.name}@0"], "ng-neighbour").start()
        try:
            before = helper_status()
            text = t.section(lambda: (
                poke.write_text(f"0 0x0 {0xFFFF_FFFE:#x}\n"),
                poke.write_text(f"0 {slot - start + SDHCI_ARGUMENT:#x} {value ^ 0xFFFF:#x}\n"),
                poke.write_text("0 0x0 0x0\n")))
            after = helper_status()
        finally:
            assert t.stop() == 0, t.stderr()
    # three mappings, each a write and a read through the armed page
    assert after["emulated"] - before["emulated"] == 6, (before, after)
    assert to_records(text, start) == [
        ("MAP", 0, 0x100), ("W", 4, 0, 0xFFFFFFFE), ("R", 4, 0, 0xFFFFFFFE), ("UNMAP",),
        ("MAP", 0, 0x100), ("UNMAP",),
        ("MAP", 0, 0x100), ("W", 4, 0, 0), ("R", 4, 0, 0), ("UNMAP",),
    ], text
