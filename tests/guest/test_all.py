"""--all against the kernel's own tracer, and a device that appears while
tracing.

The kernel's tracer traces every mapping made while it runs; mmiotrace-ng
--all every PCI device's memory BARs and ROMs (other ioremaps get MAP and
UNMAP lines only).  Loading e1000 and running an edu scenario under both,
the streams must be the same record for record once timestamps, map ids
and virtual addresses are normalized.  Repeated reads count one by one.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import EXERCISER_DEBUGFS
from kernel_tracer import (
    assert_same,
    between,
    capture,
    find_pci_device,
    map_id_problems,
    normalize,
    prepared_e1000_load,
)
from ng_tracer import NgTracer
from test_engine_safety import stress

E1000_ID = (0x8086, 0x100E)
HPET = 0xFED00000


def test_all_matches_the_kernel_tracer(exerciser):
    dev = find_pci_device(*E1000_ID)
    assert dev is not None, "boot the VM with --qemu '-device e1000,...'"
    subprocess.run(["rmmod", "e1000"], capture_output=True)

    def workload() -> None:
        prepared_e1000_load("all-begin", "all-end", also=lambda: exerciser.run("readl"))

    kernel = capture(workload, until=lambda text: "all-end" in text, quiet=2.0, timeout=300)
    subprocess.run(["rmmod", "e1000"], check=True)
    t = NgTracer(["--all", "--compat"], "ng-all").start()
    try:
        workload()
        ours = t.wait_for("all-end")
    finally:
        assert t.stop() == 0, t.stderr()
        subprocess.run(["rmmod", "e1000"], capture_output=True)
    k = normalize(between(kernel, "all-begin", "all-end"))
    o = normalize(between(ours, "all-begin", "all-end"))
    maps = [ln for ln in k if ln.startswith("MAP ")]
    assert any(f"0x{dev.bars[0][0]:x}" in ln for ln in maps), maps
    assert any(f"0x{exerciser.bar0[0]:x}" in ln for ln in maps), maps
    assert sum(ln.startswith("W ") for ln in k) > 3000
    assert map_id_problems(between(ours, "all-begin", "all-end")) == []
    assert_same(o, k)
    dups = [i for i in range(1, len(o)) if o[i].startswith("R ") and o[i] == o[i - 1]]
    assert dups and o[: dups[0]] + o[dups[0] + 1 :] != k     # repeats are counted


def test_device_added_while_tracing_is_traced(exerciser):
    """The NIC is removed before the start, so --all does not list it; a
    rescan brings it back while tracing and e1000 binds to it: the probe's
    mapping and accesses are in the trace."""
    dev = find_pci_device(*E1000_ID)
    assert dev is not None
    subprocess.run(["rmmod", "e1000"], capture_output=True)
    subprocess.run(["modprobe", "e1000"], check=True)
    Path(f"/sys/bus/pci/devices/{dev.name}/remove").write_text("1")
    try:
        t = NgTracer(["--all"], "ng-all-hotplug").start()
        try:
            text = t.section(lambda: Path("/sys/bus/pci/rescan").write_text("1"))
        finally:
            assert t.stop() == 0, t.stderr()
    finally:
        Path("/sys/bus/pci/rescan").write_text("1")
        subprocess.run(["rmmod", "e1000"], capture_output=True)
    back = find_pci_device(*E1000_ID)
    assert back is not None and back.driver in (None, "e1000")
    bar0 = back.bars[0][0]
    maps = [ln.split() for ln in text.splitlines() if ln.startswith("MAP ")]
    ids = {m[2] for m in maps if int(m[3], 16) == bar0}
    assert ids, f"no MAP of the re-added NIC's BAR0 0x{bar0:x}:\n{text[:3000]}"
    accesses = [ln for ln in text.splitlines()
                if ln.startswith(("R ", "W ")) and ln.split()[3] in ids]
    assert len(accesses) > 100, f"{len(accesses)} accesses of the re-added NIC"
    assert "NOT traced" not in text


RW_LINE = re.compile(r"^(R|W) (\d+) \S+ (\S+) (0x[0-9a-f]+) (0x[0-9a-f]+) ")


def test_an_ioremap_of_no_pci_device_gets_map_and_unmap_only(exerciser):
    """--all: the exerciser maps the HPET's registers (no PCI device's) and
    reads one: the trace has that mapping's MAP and UNMAP and no access of
    it (as documented: --all traces the accesses of PCI BARs and ROMs)."""
    t = NgTracer(["--all"], "ng-all-nonpci").start()
    try:
        text = t.section(lambda: stress("nonpci"))
    finally:
        assert t.stop() == 0, t.stderr()
    assert int((EXERCISER_DEBUGFS / "nonpci_value").read_text(), 16), "the read did not happen"
    maps = [ln.split() for ln in text.splitlines() if ln.startswith("MAP ")]
    hpet = [m for m in maps if int(m[3], 16) == HPET]
    assert len(hpet) == 1 and int(hpet[0][5], 16) == 1024, maps
    assert [ln for ln in text.splitlines()
            if ln.startswith("UNMAP ") and ln.split()[2] == hpet[0][2]], text[-2000:]
    assert not [ln for ln in text.splitlines() if (m := RW_LINE.match(ln))
                and HPET <= int(m[4], 16) < HPET + 1024], text[-2000:]


def test_an_expansion_rom_read_is_traced(exerciser):
    """--all traces ROMs: the NIC's option ROM read whole through sysfs (the
    kernel maps it, walks its images' headers for the size, copies it out):
    every read in the trace has the bytes the read returned at its offset,
    and the reads cover every byte returned."""
    nic = find_pci_device(*E1000_ID)
    assert nic is not None, "boot the VM with --qemu '-device e1000,...'"
    res = Path(f"/sys/bus/pci/devices/{nic.name}/resource").read_text().splitlines()
    rom_start, rom_end = (int(x, 16) for x in res[6].split()[:2])
    assert rom_start and rom_end > rom_start, res[6]
    rom = Path(f"/sys/bus/pci/devices/{nic.name}/rom")
    got = bytearray()

    def read_rom() -> None:
        rom.write_text("1")
        fd = os.open(rom, os.O_RDONLY)
        try:
            while chunk := os.read(fd, 1 << 20):
                got.extend(chunk)
        finally:
            os.close(fd)
            rom.write_text("0")

    t = NgTracer(["--all"], "ng-all-rom").start()
    try:
        text = t.section(read_rom)
    finally:
        assert t.stop() == 0, t.stderr()
    assert len(got) >= 512 and got[:2] == b"\x55\xaa", bytes(got[:16])
    seen = bytearray(len(got))
    reads = 0
    for ln in text.splitlines():
        if (m := RW_LINE.match(ln)) and rom_start <= int(m[4], 16) <= rom_end:
            assert m[1] == "R", ln
            off, width = int(m[4], 16) - rom_start, int(m[2])
            assert off + width <= len(got), ln
            assert int(m[5], 16).to_bytes(width, "little") == got[off:off + width], ln
            seen[off:off + width] = b"\x01" * width
            reads += 1
    print(f"{len(got)} bytes of ROM, {reads} reads traced")
    assert all(seen), f"{seen.count(0)} of {len(got)} bytes read untraced"
