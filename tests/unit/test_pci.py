"""pci.py on a fake sysfs tree laid out as the kernel lays out the real one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from mmiotrace_ng.tracer.pci import (
    BadPciAddress,
    Bar,
    NoMemoryBars,
    NoSuchPciDevice,
    PciAddress,
    PciError,
    device_bars,
    parse_address,
    selected_bars,
)

REPO = Path(__file__).resolve().parents[2]

# drivers/pci/pci-sysfs.c resource_show(): one line per resource
RESOURCE_LINE = "0x%016llx 0x%016llx 0x%016llx\n".replace("ll", "")

# Flags as the kernel reports them (include/linux/ioport.h bits, low bits = BAR bits)
MEM32 = 0x0004_0200  # IORESOURCE_MEM | IORESOURCE_SIZEALIGN
IO = 0x0004_0101  # IORESOURCE_IO | IORESOURCE_SIZEALIGN | PCI_BASE_ADDRESS_SPACE_IO
MEM64_PREF = (
    0x0014_220C  # MEM_64 | SIZEALIGN | PREFETCH | MEM | 64-bit prefetchable bits
)
ROM = 0x0004_6200  # IORESOURCE_MEM | READONLY | CACHEABLE | SIZEALIGN
UNSET = 0x2000_0000


def fake_device(
    root: Path,
    name: str,
    resources: list[tuple[int, int, int]],
) -> Path:
    """/sys/devices/pci0000:00/<name> and the /sys/bus/pci/devices symlink."""
    real = root / "devices" / "pci0000:00" / name
    real.mkdir(parents=True)
    lines = resources + [(0, 0, 0)] * (13 - len(resources))  # 13 lines with SR-IOV
    (real / "resource").write_text("".join(RESOURCE_LINE % r for r in lines))
    link_dir = root / "bus" / "pci" / "devices"
    link_dir.mkdir(parents=True, exist_ok=True)
    (link_dir / name).symlink_to(os.path.relpath(real, link_dir))
    return real


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    # the edu device of the reference stream: BAR0 1 MiB at 0xfea00000
    fake_device(tmp_path, "0000:00:09.0", [(0xFEA00000, 0xFEAFFFFF, MEM32)])
    # a virtio device: I/O BAR0, BAR1 32-bit memory, BAR4/5 64-bit prefetchable, a ROM
    fake_device(
        tmp_path,
        "0000:00:01.0",
        [
            (0xC000, 0xC03F, IO),
            (0xFEB00000, 0xFEB00FFF, MEM32),
            (0, 0, 0),
            (0, 0, 0),
            (0xFEBE4000, 0xFEBE7FFF, MEM64_PREF),
            (0, 0, 0),
            (0xFEB40000, 0xFEB7FFFF, ROM),
        ],
    )
    # I/O only
    fake_device(
        tmp_path,
        "0000:00:1f.3",
        [(0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0x700, 0x73F, IO)],
    )
    # memory BAR left unassigned by the firmware, and a ROM only
    fake_device(
        tmp_path,
        "0001:02:00.0",
        [(0, 0xFFFFF, MEM32 | UNSET)]
        + [(0, 0, 0)] * 5
        + [(0xFE000000, 0xFE00FFFF, ROM)],
    )
    return tmp_path


@pytest.mark.parametrize(
    ("text", "addr"),
    [
        ("0000:01:00.0", PciAddress(0, 1, 0, 0)),
        ("01:00.0", PciAddress(0, 1, 0, 0)),
        ("1:0.0", PciAddress(0, 1, 0, 0)),
        ("00:1f.3", PciAddress(0, 0, 0x1F, 3)),
        ("0000:00:1F.7", PciAddress(0, 0, 0x1F, 7)),
        (" ff:1f.7\n", PciAddress(0, 0xFF, 0x1F, 7)),
        ("0001:02:00.0", PciAddress(1, 2, 0, 0)),
        ("10000:00:00.0", PciAddress(0x10000, 0, 0, 0)),  # VMD domains
    ],
)
def test_parse_address(text: str, addr: PciAddress) -> None:
    assert parse_address(text) == addr


def test_address_str() -> None:
    assert str(parse_address("1:0.0")) == "0000:01:00.0"
    assert str(parse_address("10000:a:1f.7")) == "10000:0a:1f.7"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "expected"),
        ("01:00", "expected"),
        ("01.00.0", "expected"),
        ("100:00.0", "expected"),  # bus: 2 hex digits at most
        ("000:00", "expected"),
        ("00:000.0", "expected"),
        ("g0:00.0", "expected"),
        ("0000:01:00.0.1", "expected"),
        ("00:20.0", "device 20 is not in 00-1f"),
        ("00:1f.8", "function 8 is not in 0-7"),
        ("00:00.a", "function a is not in 0-7"),
    ],
)
def test_parse_address_rejects(text: str, why: str) -> None:
    with pytest.raises(BadPciAddress, match=why) as info:
        parse_address(text)
    assert repr(text) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, PciError)


def test_device_bars_edu(sysfs: Path) -> None:
    bars = device_bars("00:09.0", sysfs_root=sysfs)
    assert bars == [Bar(0, 0xFEA00000, 0xFEAFFFFF, MEM32)]
    assert bars[0].size == 0x100000


def test_device_bars_skips_io_empty_and_rom(sysfs: Path) -> None:
    bars = device_bars(PciAddress(0, 0, 1, 0), sysfs_root=str(sysfs))
    assert [(b.index, b.start, b.size) for b in bars] == [
        (1, 0xFEB00000, 0x1000),
        (4, 0xFEBE4000, 0x4000),
    ]
    assert bars[1].flags == MEM64_PREF


def test_device_absent(sysfs: Path) -> None:
    with pytest.raises(
        NoSuchPciDevice, match=r"^no PCI device 0000:01:00\.0 \(see lspci\)$"
    ):
        device_bars("01:00.0", sysfs_root=sysfs)


def test_device_without_memory_bars(sysfs: Path) -> None:
    with pytest.raises(NoMemoryBars, match=r"0000:00:1f\.3 has no memory BARs"):
        device_bars("00:1f.3", sysfs_root=sysfs)
    # an unassigned BAR and a ROM do not count
    with pytest.raises(NoMemoryBars, match=r"0001:02:00\.0"):
        device_bars("0001:02:00.0", sysfs_root=sysfs)


def test_malformed_resource_file(sysfs: Path) -> None:
    (sysfs / "devices/pci0000:00/0000:00:09.0/resource").write_text("0x1 0x2\n")
    with pytest.raises(PciError, match="line 1 malformed"):
        device_bars("00:09.0", sysfs_root=sysfs)


def test_bad_address_before_io(tmp_path: Path) -> None:
    with pytest.raises(BadPciAddress):
        device_bars("nonsense", sysfs_root=tmp_path)


@pytest.mark.parametrize(("spec", "indexes"), [
    ("00:01.0", [1, 4]), ("00:01.0@4", [4]), ("00:01.0@1", [1]), ("00:01.0@4,1,4", [1, 4]),
])
def test_selected_bars(sysfs: Path, spec: str, indexes: list[int]) -> None:
    bdf, bars = selected_bars(spec, sysfs_root=sysfs)
    assert bdf == "00:01.0" and [b.index for b in bars] == indexes


@pytest.mark.parametrize(("spec", "exc", "message"), [
    ("00:01.0@0", NoMemoryBars,
     "PCI device 0000:00:01.0 has no memory BAR 0 (its memory BARs: 1, 4)"),
    ("00:01.0@6", NoMemoryBars,
     "PCI device 0000:00:01.0 has no memory BAR 6 (its memory BARs: 1, 4)"),
    ("00:01.0@", BadPciAddress, "bad BAR list '' in '00:01.0@': BAR numbers 0-5"),
    ("00:01.0@a", BadPciAddress, "bad BAR list 'a' in '00:01.0@a'"),
    ("00:01.0@1@4", BadPciAddress, "bad BAR list '1@4'"),
    ("00:33.0@1", BadPciAddress, "bad PCI address '00:33.0'"),
])
def test_selected_bars_rejects(sysfs: Path, spec: str, exc: type, message: str) -> None:
    with pytest.raises(exc, match="^" + re.escape(message)):
        selected_bars(spec, sysfs_root=sysfs)


def test_device_irqs(tmp_path: Path) -> None:
    """MSI vectors, or else the INTx line of an enabled device (before its
    driver enables it, "irq" is not the line it will have; with MSI-X on it
    is the unused INTx line, maybe another device's)."""
    from mmiotrace_ng.tracer.pci import device_irqs

    base = tmp_path / "bus/pci/devices"
    for name, enable, irq, msi in (("0000:00:03.0", "1", "21", ["40", "41"]),
                                   ("0000:00:04.0", "0", "11", []),
                                   ("0000:00:05.0", "1", "0", ["33"]),
                                   ("0000:00:07.0", "1", "19", [])):
        d = base / name
        (d / "msi_irqs").mkdir(parents=True)
        (d / "enable").write_text(enable + "\n")
        (d / "irq").write_text(irq + "\n")
        for n in msi:
            (d / "msi_irqs" / n).write_text("msi\n")
    assert device_irqs("0000:00:03.0", tmp_path) == [40, 41]
    assert device_irqs("0000:00:04.0", tmp_path) == []
    assert device_irqs("0000:00:05.0", tmp_path) == [33]
    assert device_irqs("0000:00:06.0", tmp_path) == []
    assert device_irqs("0000:00:07.0", tmp_path) == [19]
