"""The device a replay plays to: what sysfs says of it (its memory BARs, its
ids, the driver bound to it) and its BARs mapped from user space.

A BAR is its sysfs `resourceN` file mapped with mmap (MAP_SHARED, read and
write).  Each access is one load or store of its width: a memoryview of the
bytes cast to B/H/I/Q and indexed once, which CPython does with a memcpy of
that constant size (one mov), never byte by byte.  Every access is checked
against the size of its BAR here as well as by the plan: nothing outside the
selected device's BARs can be touched.

The player sees a device as the `Device` protocol only, so tests give it a
model of a device instead (tests/unit/test_replay.py).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from ..tracer import pci

FORMATS: Final = {1: "B", 2: "H", 4: "I", 8: "Q"}


class DeviceError(Exception):
    """The device cannot be used as asked (the message says why)."""


@dataclass(frozen=True)
class DeviceInfo:
    """A PCI device as sysfs describes it."""

    address: pci.PciAddress
    vendor: int
    device: int
    bars: dict[int, pci.Bar]        # memory BARs by index
    driver: str | None              # the bound driver's name, if any
    path: Path                      # its sysfs directory

    @property
    def busdevfn(self) -> int:
        a = self.address
        return a.bus << 8 | a.device << 3 | a.function


def describe(bdf: str, sysfs_root: str | os.PathLike[str] = "/sys") -> DeviceInfo:
    """The device at bdf ("[DDDD:]BB:DD.F"): DeviceError if there is none or
    it has no memory BAR."""
    try:
        address = pci.parse_address(bdf)
        path = pci.device_dir(address, sysfs_root)
        bars = {b.index: b for b in pci.device_bars(address, sysfs_root)}
        vendor = int((path / "vendor").read_text(), 16)
        device = int((path / "device").read_text(), 16)
    except pci.PciError as exc:
        raise DeviceError(str(exc)) from exc
    except (OSError, ValueError) as exc:
        raise DeviceError(f"cannot read {bdf}'s ids in sysfs: {exc}") from exc
    driver = path / "driver"
    name = os.path.basename(os.readlink(driver)) if driver.is_symlink() else None
    return DeviceInfo(address, vendor, device, bars, name, path)


class Device(Protocol):
    """What the player needs of a device: exact-width accesses by BAR and
    offset, and where a BAR is mapped (for the MAP lines of the replay's
    trace)."""

    def read(self, bar: int, offset: int, width: int) -> int: ...

    def write(self, bar: int, offset: int, width: int, value: int) -> None: ...

    def virt(self, bar: int, offset: int) -> int: ...

    def close(self) -> None: ...


def access_format(index: int, size: int, offset: int, width: int) -> str:
    """The struct format of an access of width bytes at offset in BAR index
    of size bytes; DeviceError if there is no such width or it is outside."""
    fmt = FORMATS.get(width)
    if fmt is None:
        raise DeviceError(f"BAR {index}: no {width}-byte accesses")
    if offset < 0 or offset + width > size:
        raise DeviceError(f"BAR {index}: offset {offset:#x} (+{width}) is outside "
                          f"its {size:#x} bytes")
    return fmt


def check_value(index: int, width: int, value: int) -> None:
    """DeviceError if value does not fit a write of width bytes."""
    if not 0 <= value < 1 << 8 * width:
        raise DeviceError(f"BAR {index}: {value:#x} is wider than {width} bytes")


class BarWindow:
    """A BAR's bytes (an mmap, or any writable buffer in tests) accessed at
    exact widths, every access checked against the BAR's size."""

    def __init__(self, index: int, buf: mmap.mmap | bytearray, size: int) -> None:
        self.index = index
        self.size = size
        self._buf = buf
        self._bytes = memoryview(buf).cast("B")
        if len(self._bytes) < size:
            raise DeviceError(f"BAR {index}: only {len(self._bytes)} bytes mapped of {size}")

    def _view(self, offset: int, width: int) -> memoryview:
        fmt = access_format(self.index, self.size, offset, width)
        return self._bytes[offset:offset + width].cast(fmt)

    def read(self, offset: int, width: int) -> int:
        return self._view(offset, width)[0]

    def write(self, offset: int, width: int, value: int) -> None:
        check_value(self.index, width, value)
        self._view(offset, width)[0] = value

    def address(self) -> int:
        """Where the BAR is mapped in this process (0 if it is not an mmap)."""
        import ctypes

        buf = self._buf
        if not isinstance(buf, mmap.mmap):
            return 0
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))

    def close(self) -> None:
        self._bytes.release()
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()


class BarAccess(Protocol):
    """One BAR reached at exact widths (a BarWindow, or VFIO's region)."""

    def read(self, offset: int, width: int) -> int: ...

    def write(self, offset: int, width: int, value: int) -> None: ...

    def address(self) -> int: ...

    def close(self) -> None: ...


class Bars:
    """A device's BARs by index, each a BarAccess: the Device the player
    plays to.  A subclass opens the way to the device (_open) and reaches
    one memory BAR (_map, which calls _add); nothing stays open if either
    fails."""

    def __init__(self, info: DeviceInfo, bars: set[int]) -> None:
        """Reach the given BARs of info (all must be memory BARs of it)."""
        self.info = info
        self.windows: dict[int, BarAccess] = {}
        self._virt: dict[int, int] = {}
        try:
            self._open()
            for index in sorted(bars):
                bar = info.bars.get(index)
                if bar is None:
                    raise DeviceError(f"{info.address} has no memory BAR {index}")
                self._map(index, bar)
        except DeviceError:
            self.close()
            raise

    def _open(self) -> None:
        """What the BARs are reached through, opened (nothing by default)."""

    def _map(self, index: int, bar: pci.Bar) -> None:
        raise NotImplementedError

    def _add(self, index: int, window: BarAccess) -> None:
        self.windows[index] = window
        self._virt[index] = window.address()

    def _window(self, bar: int) -> BarAccess:
        window = self.windows.get(bar)
        if window is None:
            raise DeviceError(f"BAR {bar} of {self.info.address} is not mapped")
        return window

    def read(self, bar: int, offset: int, width: int) -> int:
        return self._window(bar).read(offset, width)

    def write(self, bar: int, offset: int, width: int, value: int) -> None:
        self._window(bar).write(offset, width, value)

    def virt(self, bar: int, offset: int) -> int:
        return self._virt.get(bar, 0) + offset

    def close(self) -> None:
        for window in self.windows.values():
            window.close()
        self.windows.clear()


class SysfsDevice(Bars):
    """The BARs of a device mapped through its sysfs resourceN files."""

    def _map(self, index: int, bar: pci.Bar) -> None:
        path = self.info.path / f"resource{index}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_SYNC | os.O_CLOEXEC)
        except OSError as exc:
            raise DeviceError(f"cannot open {path}: {exc.strerror}") from exc
        try:
            buf = mmap.mmap(fd, bar.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            hint = (" (a driver holds the region and the kernel allows no mapping of it, "
                    "CONFIG_IO_STRICT_DEVMEM: unbind the driver)"
                    if getattr(exc, "errno", None) == 22 and self.info.driver else "")
            raise DeviceError(f"cannot map {path}: {why}{hint}") from exc
        finally:
            os.close(fd)
        self._add(index, BarWindow(index, buf, bar.size))
