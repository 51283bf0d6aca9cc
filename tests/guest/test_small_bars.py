"""BARs smaller than a page: traced like any other, compared with the kernel's
own mmiotrace on real in-tree drivers, in the same boot.

The test guest has QEMU's i6300esb watchdog (one 16-byte memory BAR, driver
i6300esb) and sdhci-pci (one 256-byte BAR, driver sdhci-pci), both kept from
loading at boot; SeaBIOS packs such BARs, so they can share a page with
another device's BAR.  Each driver is loaded and unloaded under the kernel's
tracer, then under mmiotrace-ng --compat: the records of the device's BAR
must be the same, polling reads collapsed.  An exerciser scenario maps a
16-byte window of the edu BAR on its own.
"""

from __future__ import annotations

import subprocess

import pytest
from kernel_tracer import capture, find_pci_device, to_records
from ng_tracer import NgTracer, helper_status
from test_engine_safety import stress

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


def bar_records(text: str, start: int, size: int) -> list[tuple]:
    """The records of one BAR, offsets from its start; runs of one read collapsed."""
    out = []
    for r in to_records(text, start):
        if r[0] in ("R", "W") and 0 <= r[2] < size:
            out.append(r)
        elif r[0] in ("MAP", "UNKNOWN") and 0 <= r[1] < size:
            out.append(r)
        elif r[0] in ("?", "LOST"):
            out.append(r)
    return [r for i, r in enumerate(out) if not (i and r[0] == "R" and out[i - 1] == r)]


@pytest.mark.parametrize("driver", list(DEVICES))
def test_small_bar_driver_matches_kernel(driver):
    dev = device(driver)
    start, size = dev.bars[0]
    subprocess.run(["rmmod", driver], capture_output=True)
    load_unload(driver)             # the first load after boot finds another state
    kernel = capture(lambda: load_unload(driver), quiet=2.0, timeout=300)
    t = NgTracer(["--pci", dev.name, "--compat", "--", "sh", "-c",
                  f"modprobe {driver} && rmmod {driver}"], f"ng-{driver}")
    t.start()
    assert t.proc.wait(600) == 0, t.stderr()
    k, o = bar_records(kernel, start, size), bar_records(t.text(), start, size)
    assert sum(r[0] in ("R", "W") for r in k) >= 2, k
    assert any(r[0] == "MAP" for r in o), o
    assert o == k
    assert "NOT traced" not in t.text()
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
