"""PCI addresses and the memory BARs of a device, read from sysfs."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final, NamedTuple

# include/linux/ioport.h
IORESOURCE_MEM: Final = 0x0000_0200
IORESOURCE_DISABLED: Final = 0x1000_0000
IORESOURCE_UNSET: Final = 0x2000_0000

PCI_STD_NUM_BARS: Final = 6

_ADDRESS = re.compile(
    r"(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})\.(?P<fn>[0-9a-f])"
)
_EXAMPLE: Final = (
    "expected [DDDD:]BB:DD.F in hex, e.g. 0000:01:00.0 or 01:00.0 (see lspci -D)"
)


class PciError(Exception):
    """A PCI device cannot be used as asked."""


class BadPciAddress(PciError, ValueError):
    """A malformed PCI address argument."""


class NoSuchPciDevice(PciError, LookupError):
    """No device at that address."""


class NoMemoryBars(PciError):
    """The device has no memory BAR to trace."""


class PciAddress(NamedTuple):
    domain: int
    bus: int
    device: int
    function: int

    def __str__(self) -> str:
        """As sysfs names the device: dddd:bb:dd.f."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"


def parse_address(text: str) -> PciAddress:
    """Parse "0000:01:00.0", "01:00.0" or "1:0.0" (hex; domain defaults to 0)."""
    arg = text.strip().lower()
    m = _ADDRESS.fullmatch(arg)
    if not m:
        raise BadPciAddress(f"bad PCI address {text!r}: {_EXAMPLE}")
    device, function = int(m["dev"], 16), int(m["fn"], 16)
    if device > 0x1F:
        raise BadPciAddress(
            f"bad PCI address {text!r}: device {m['dev']} is not in 00-1f"
        )
    if function > 7:
        raise BadPciAddress(
            f"bad PCI address {text!r}: function {m['fn']} is not in 0-7"
        )
    domain = int(m["domain"], 16) if m["domain"] else 0
    return PciAddress(domain, int(m["bus"], 16), device, function)


def _address(bdf: str | PciAddress) -> PciAddress:
    return bdf if isinstance(bdf, PciAddress) else parse_address(bdf)


def device_dir(
    bdf: str | PciAddress, sysfs_root: str | os.PathLike[str] = "/sys"
) -> Path:
    """/sys/bus/pci/devices/<dddd:bb:dd.f>, which must exist."""
    addr = _address(bdf)
    path = Path(sysfs_root, "bus/pci/devices", str(addr))
    if not path.is_dir():
        raise NoSuchPciDevice(f"no PCI device {addr} (see lspci)")
    return path


class Bar(NamedTuple):
    index: int
    start: int
    end: int
    flags: int

    @property
    def size(self) -> int:
        return self.end - self.start + 1


def resources(path: Path, addr: PciAddress | None = None) -> list[tuple[int, int, int]]:
    """The lines of the sysfs `resource` file of the device at path (addr
    names it in errors): start end flags, hex."""
    try:
        text = (path / "resource").read_text()
    except FileNotFoundError:
        raise NoSuchPciDevice(f"no PCI device {addr or path} (see lspci)") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        try:
            start, end, flags = (int(f, 16) for f in line.split())
        except ValueError:
            raise PciError(
                f"{path / 'resource'} line {lineno} malformed: {line!r}"
            ) from None
        rows.append((start, end, flags))
    return rows


def device_bars(
    bdf: str | PciAddress, sysfs_root: str | os.PathLike[str] = "/sys"
) -> list[Bar]:
    """The assigned memory BARs (0-5) of a device: I/O, empty, unassigned or
    disabled ones and the expansion ROM are left out."""
    addr = _address(bdf)
    path = device_dir(addr, sysfs_root)
    bars = []
    for index, (start, end, flags) in enumerate(
        resources(path, addr)[:PCI_STD_NUM_BARS]
    ):
        if not flags & IORESOURCE_MEM or flags & (
            IORESOURCE_UNSET | IORESOURCE_DISABLED
        ):
            continue
        if start == 0 or end <= start:
            continue
        bars.append(Bar(index, start, end, flags))
    if not bars:
        raise NoMemoryBars(f"PCI device {addr} has no memory BARs: nothing to trace")
    return bars


PCI_ROM_RESOURCE: Final = 6


def all_memory_ranges(sysfs_root: str | os.PathLike[str] = "/sys") -> list[Bar]:
    """The assigned memory BARs and expansion ROMs of every PCI device
    (--all), each once, in address order."""
    found: dict[tuple[int, int], Bar] = {}
    for path in sorted(Path(sysfs_root, "bus", "pci", "devices").iterdir()):
        try:
            rows = (path / "resource").read_text().splitlines()[:PCI_ROM_RESOURCE + 1]
        except OSError:
            continue        # gone meanwhile
        for index, line in enumerate(rows):
            try:
                start, end, flags = (int(f, 16) for f in line.split())
            except ValueError:
                continue
            if (flags & IORESOURCE_MEM and not flags & (IORESOURCE_UNSET | IORESOURCE_DISABLED)
                    and start and end > start):
                found.setdefault((start, end), Bar(index, start, end, flags))
    return sorted(found.values(), key=lambda b: b.start)


def parse_spec(spec: str) -> tuple[PciAddress, list[int] | None]:
    """The syntax of a --pci argument: "BDF" (None: all its memory BARs) or
    "BDF@N[,N...]" (BARs N); BadPciAddress if it is malformed (a BAR the
    device lacks is for selected_bars to say)."""
    bdf, at, wanted = spec.partition("@")
    addr = parse_address(bdf)
    if not at:
        return addr, None
    try:
        indexes = [int(n, 10) for n in wanted.split(",")]
    except ValueError:
        raise BadPciAddress(
            f"bad BAR list {wanted!r} in {spec!r}: BAR numbers 0-5, e.g. {bdf}@0,2"
        ) from None
    return addr, sorted(set(indexes))


def selected_bars(
    spec: str, sysfs_root: str | os.PathLike[str] = "/sys"
) -> tuple[str, list[Bar]]:
    """The device and the memory BARs a --pci argument names: "BDF" (all its
    memory BARs) or "BDF@N[,N...]" (BARs N only, 0-5), e.g. a GPU's register
    BAR without its VRAM aperture."""
    bdf = spec.partition("@")[0]
    _, indexes = parse_spec(spec)
    bars = device_bars(bdf, sysfs_root)
    if indexes is None:
        return bdf, bars
    by_index = {b.index: b for b in bars}
    for n in indexes:
        if n not in by_index:
            have = ", ".join(str(i) for i in by_index)
            raise NoMemoryBars(f"PCI device {_address(bdf)} has no memory BAR {n} "
                               f"(its memory BARs: {have})")
    return bdf, [by_index[n] for n in indexes]


def all_devices(sysfs_root: str | os.PathLike[str] = "/sys") -> list[str]:
    """The addresses of every PCI device (--all), in order."""
    return sorted(p.name for p in Path(sysfs_root, "bus", "pci", "devices").iterdir())


def device_irqs(bdf: str, sysfs_root: str | os.PathLike[str] = "/sys") -> list[int]:
    """The interrupts a device has now: its MSI/MSI-X vectors (msi_irqs/),
    or if it has none and is enabled, its INTx line (irq; 0 for none), in
    order.  Empty if the device went away."""
    path = Path(sysfs_root, "bus/pci/devices", bdf)
    found: set[int] = set()
    try:
        found.update(int(p.name) for p in (path / "msi_irqs").iterdir() if p.name.isdigit())
    except OSError:
        pass                # no MSI vector allocated
    if found:
        # MSI or MSI-X on: its INTx line (MSI-X leaves "irq" at it) is not
        # its own, and may be another device's
        return sorted(found)
    try:
        # not enabled yet: "irq" is not the line it will have (its driver
        # enables it, then the kretprobe of pcibios_enable_device sees it)
        if int((path / "enable").read_text().strip()):
            line = int((path / "irq").read_text().strip())
            if line > 0:
                found.add(line)
    except (OSError, ValueError):
        pass
    return sorted(found)
