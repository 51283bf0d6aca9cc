"""--all against the kernel's own tracer, and a device that appears while
tracing.

The kernel's tracer traces every mapping made while it runs; mmiotrace-ng
--all every PCI device's memory BARs and ROMs (other ioremaps get MAP and
UNMAP lines only).  Loading e1000 and running an edu scenario under both,
the streams must be the same record for record once timestamps, map ids
and virtual addresses are normalized.  Repeated reads count one by one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

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

E1000_ID = (0x8086, 0x100E)


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
