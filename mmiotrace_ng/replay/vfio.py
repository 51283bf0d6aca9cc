"""A device bound to vfio-pci, its BARs reached through VFIO: the group's
container with the machine's IOMMU (type 1).  vfio's no-IOMMU mode is not
used (Debian's kernels are built without it).

This is the way to a device where the sysfs resourceN files are refused:
lockdown (Secure Boot) refuses their mapping, not VFIO's with an IOMMU.

The ioctls are the legacy container interface of linux/vfio.h (every kernel
since 4.5 has it; newer ones also have iommufd's, which is not used): the
group file /dev/vfio/N, the container /dev/vfio/vfio, one
device file.  A BAR whose region can be mapped is mapped (a BarWindow, as a
sysfs mapping); one that cannot is read and written with pread/pwrite of
its width at the region's offset, which vfio-pci turns into one access of
that width.  No DMA mapping is made: the device can reach no memory.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
from pathlib import Path
from typing import Final

from ..tracer import pci
from .device import Bars, BarWindow, DeviceError, DeviceInfo, access_format, check_value

# linux/vfio.h: _IO(VFIO_TYPE ';', VFIO_BASE 100 + n)
_VFIO_TYPE: Final = ord(";")
VFIO_GET_API_VERSION: Final = _VFIO_TYPE << 8 | 100
VFIO_CHECK_EXTENSION: Final = _VFIO_TYPE << 8 | 101
VFIO_SET_IOMMU: Final = _VFIO_TYPE << 8 | 102
VFIO_GROUP_GET_STATUS: Final = _VFIO_TYPE << 8 | 103
VFIO_GROUP_SET_CONTAINER: Final = _VFIO_TYPE << 8 | 104
VFIO_GROUP_GET_DEVICE_FD: Final = _VFIO_TYPE << 8 | 106
VFIO_DEVICE_GET_REGION_INFO: Final = _VFIO_TYPE << 8 | 108
VFIO_API_VERSION: Final = 0
VFIO_TYPE1_IOMMU: Final = 1
VFIO_TYPE1v2_IOMMU: Final = 3
VFIO_GROUP_FLAGS_VIABLE: Final = 1 << 0
VFIO_REGION_INFO_FLAG_READ: Final = 1 << 0
VFIO_REGION_INFO_FLAG_WRITE: Final = 1 << 1
VFIO_REGION_INFO_FLAG_MMAP: Final = 1 << 2
# struct vfio_group_status {argsz, flags}
GROUP_STATUS: Final = struct.Struct("=II")
# struct vfio_region_info {argsz, flags, index, cap_offset, size, offset}
REGION_INFO: Final = struct.Struct("=IIIIQQ")

DEV_VFIO = Path("/dev/vfio")


def group_node(info: DeviceInfo, dev_vfio: Path = DEV_VFIO) -> Path:
    """The device's VFIO group file, /dev/vfio/N."""
    link = info.path / "iommu_group"
    try:
        group = os.path.basename(os.readlink(link))
    except OSError as exc:
        raise DeviceError(f"{info.address} is bound to vfio-pci but has no IOMMU group "
                          f"({link}: {exc.strerror}): the machine's IOMMU is off "
                          "(intel_iommu=on, amd_iommu=on)") from exc
    node = dev_vfio / group
    if not node.exists():
        raise DeviceError(f"{info.address}: no {node} (vfio-pci not bound to it, or its "
                          "group is in no-IOMMU mode, which is not used)")
    return node


def _ioctl(fd: int, request: int, arg: int | bytearray = 0, what: str = "") -> int:
    """The call's result; a bytearray argument is updated in place (bytes
    would make fcntl.ioctl return a copy instead of the result)."""
    try:
        ret = fcntl.ioctl(fd, request, arg)  # type: ignore[call-overload]
        if not isinstance(ret, int):
            raise TypeError(f"VFIO {what}: pass a bytearray, not bytes")
        return ret
    except OSError as exc:
        raise DeviceError(f"VFIO {what or hex(request)}: {exc.strerror}") from exc


class _Region:
    """A BAR not mapped: exact-width pread/pwrite at its region's offset."""

    def __init__(self, index: int, fd: int, offset: int, size: int) -> None:
        self.index = index
        self.size = size
        self._fd = fd
        self._offset = offset

    def read(self, offset: int, width: int) -> int:
        fmt = "=" + access_format(self.index, self.size, offset, width)
        try:
            data = os.pread(self._fd, width, self._offset + offset)
        except OSError as exc:
            raise DeviceError(f"BAR {self.index}: read at {offset:#x}: {exc.strerror}") from exc
        if len(data) != width:
            raise DeviceError(f"BAR {self.index}: read at {offset:#x}: {len(data)} of "
                              f"{width} bytes")
        return int(struct.unpack(fmt, data)[0])

    def write(self, offset: int, width: int, value: int) -> None:
        fmt = "=" + access_format(self.index, self.size, offset, width)
        check_value(self.index, width, value)
        try:
            done = os.pwrite(self._fd, struct.pack(fmt, value), self._offset + offset)
        except OSError as exc:
            raise DeviceError(f"BAR {self.index}: write at {offset:#x}: {exc.strerror}") from exc
        if done != width:
            raise DeviceError(f"BAR {self.index}: write at {offset:#x}: {done} of {width} bytes")

    def address(self) -> int:
        return 0

    def close(self) -> None:
        pass


class VfioDevice(Bars):
    """The BARs of a device bound to vfio-pci, through VFIO."""

    def __init__(self, info: DeviceInfo, bars: set[int], dev_vfio: Path = DEV_VFIO) -> None:
        self.group = ""
        self._fds: list[int] = []
        self._dev_vfio = dev_vfio
        super().__init__(info, bars)

    def _open_fd(self, path: Path) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            hint = (" (another process has the device open through VFIO)"
                    if exc.errno == errno.EBUSY else "")
            raise DeviceError(f"cannot open {path}: {exc.strerror}{hint}") from exc
        self._fds.append(fd)
        return fd

    def _open(self) -> None:
        dev_vfio = self._dev_vfio
        group_path = group_node(self.info, dev_vfio)
        self.group = group_path.name
        container = self._open_fd(dev_vfio / "vfio")
        if _ioctl(container, VFIO_GET_API_VERSION, what="GET_API_VERSION") != VFIO_API_VERSION:
            raise DeviceError("VFIO: the kernel's API version is not 0")
        group = self._open_fd(group_path)
        status = bytearray(GROUP_STATUS.pack(GROUP_STATUS.size, 0))
        _ioctl(group, VFIO_GROUP_GET_STATUS, status, "GROUP_GET_STATUS")
        if not GROUP_STATUS.unpack(status)[1] & VFIO_GROUP_FLAGS_VIABLE:
            raise DeviceError(f"VFIO group {group_path.name} of {self.info.address} is not "
                              "viable: bind every device of the group to vfio-pci "
                              f"(ls {self.info.path}/iommu_group/devices)")
        _ioctl(group, VFIO_GROUP_SET_CONTAINER, bytearray(struct.pack("=i", container)),
               "GROUP_SET_CONTAINER")
        for kind in (VFIO_TYPE1v2_IOMMU, VFIO_TYPE1_IOMMU):
            if _ioctl(container, VFIO_CHECK_EXTENSION, kind, "CHECK_EXTENSION") > 0:
                try:
                    fcntl.ioctl(container, VFIO_SET_IOMMU, kind)
                except OSError as exc:
                    hint = (" (an IOMMU without interrupt remapping, which vfio_iommu_type1 "
                            "refuses unless loaded with allow_unsafe_interrupts=1: the "
                            "kernel log says)" if exc.errno == errno.EPERM else "")
                    raise DeviceError(f"VFIO SET_IOMMU: {exc.strerror}{hint}") from exc
                break
        else:
            raise DeviceError("VFIO: the container offers no type 1 IOMMU "
                              "(modprobe vfio_iommu_type1)")
        # a mutable buffer: with bytes, fcntl.ioctl returns a copy of them,
        # not the call's result (the descriptor)
        self._device = _ioctl(group, VFIO_GROUP_GET_DEVICE_FD,
                              bytearray(str(self.info.address).encode() + b"\0"),
                              "GROUP_GET_DEVICE_FD")
        self._fds.append(self._device)

    def _map(self, index: int, bar: pci.Bar) -> None:
        req = bytearray(REGION_INFO.pack(REGION_INFO.size, 0, index, 0, 0, 0))
        _ioctl(self._device, VFIO_DEVICE_GET_REGION_INFO, req, f"GET_REGION_INFO {index}")
        _argsz, flags, _index, _cap, size, offset = REGION_INFO.unpack(req)
        need = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE
        if flags & need != need or size < bar.size:
            raise DeviceError(f"VFIO: BAR {index} of {self.info.address} cannot be read and "
                              f"written whole (flags {flags:#x}, {size:#x} bytes)")
        if flags & VFIO_REGION_INFO_FLAG_MMAP:
            try:
                buf = mmap.mmap(self._device, bar.size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
            except (OSError, ValueError):
                pass    # read and written instead
            else:
                self._add(index, BarWindow(index, buf, bar.size))
                return
        self._add(index, _Region(index, self._device, offset, bar.size))

    def close(self) -> None:
        super().close()
        # the device file first: the group lets go of its container after
        for fd in reversed(self._fds):
            os.close(fd)
        self._fds.clear()
