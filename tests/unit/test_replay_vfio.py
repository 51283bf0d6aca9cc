"""replay's VFIO layer (mmiotrace_ng/replay/vfio.py) on the host: its ioctl
numbers and structs against linux/vfio.h compiled by the C compiler, the
pread/pwrite path of a BAR that cannot be mapped on a file standing for the
device's region, and its refusals.  The device itself is reached through
VFIO in the guest (tests/guest/test_lockdown_integrity.py, a machine with an
IOMMU)."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from test_replay import BDF, TRACE, make_sysfs, write_trace

from mmiotrace_ng import cli
from mmiotrace_ng.replay import vfio
from mmiotrace_ng.replay.device import DeviceError, describe

NAMES = ["VFIO_GET_API_VERSION", "VFIO_CHECK_EXTENSION", "VFIO_SET_IOMMU",
         "VFIO_GROUP_GET_STATUS", "VFIO_GROUP_SET_CONTAINER", "VFIO_GROUP_GET_DEVICE_FD",
         "VFIO_DEVICE_GET_REGION_INFO", "VFIO_API_VERSION", "VFIO_TYPE1_IOMMU",
         "VFIO_TYPE1v2_IOMMU", "VFIO_GROUP_FLAGS_VIABLE", "VFIO_REGION_INFO_FLAG_READ",
         "VFIO_REGION_INFO_FLAG_WRITE", "VFIO_REGION_INFO_FLAG_MMAP"]


def test_the_ioctls_and_structs_are_linux_vfio_h(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not Path("/usr/include/linux/vfio.h").exists():
        pytest.fail("needs a C compiler and linux/vfio.h (linux-libc-dev): tests/setup.sh "
                    "installs them")
    src = tmp_path / "v.c"
    body = "".join(f'\tprintf("{n} %lu\\n", (unsigned long)({n}));\n' for n in NAMES)
    src.write_text("#include <stdio.h>\n#include <linux/vfio.h>\nint main(void)\n{\n" + body +
                   '\tprintf("group_status %zu\\n", sizeof(struct vfio_group_status));\n'
                   '\tprintf("region_info %zu\\n", sizeof(struct vfio_region_info));\n'
                   "\treturn 0;\n}\n")
    subprocess.run([cc, "-o", str(tmp_path / "v"), str(src)], check=True)
    got = dict(line.split() for line in subprocess.run(
        [str(tmp_path / "v")], check=True, capture_output=True, text=True).stdout.splitlines())
    for name in NAMES:
        assert int(got[name]) == getattr(vfio, name), name
    assert int(got["group_status"]) == vfio.GROUP_STATUS.size
    assert int(got["region_info"]) == vfio.REGION_INFO.size


def test_a_region_is_read_and_written_at_its_offset_in_exact_widths(tmp_path):
    path = tmp_path / "region"
    path.write_bytes(bytes(0x3000))
    with open(path, "r+b") as fh:
        region = vfio._Region(0, fh.fileno(), 0x1000, 0x1000)
        region.write(0x10, 4, 0x12345678)
        region.write(0x20, 8, 0x1122334455667788)
        region.write(0x30, 1, 0xAB)
        region.write(0x32, 2, 0xCDEF)
        assert region.read(0x10, 4) == 0x12345678
        assert region.read(0x20, 8) == 0x1122334455667788
        assert region.read(0x30, 1) == 0xAB
        assert region.read(0x32, 2) == 0xCDEF
        for offset, width in ((0xFFE, 4), (-1, 1), (0x1000, 1)):
            with pytest.raises(DeviceError, match="outside its 0x1000 bytes"):
                region.read(offset, width)
        with pytest.raises(DeviceError, match="wider than 2 bytes"):
            region.write(0, 2, 0x10000)
        with pytest.raises(DeviceError, match="no 3-byte accesses"):
            region.read(0, 3)
    data = path.read_bytes()
    assert data[0x1010:0x1014] == struct.pack("<I", 0x12345678)
    assert data[0x1030] == 0xAB and data[0x1032:0x1034] == struct.pack("<H", 0xCDEF)
    assert data[:0x1000] == bytes(0x1000) and data[0x2000:] == bytes(0x1000)


def test_a_device_without_an_iommu_group_is_refused_with_why(tmp_path):
    make_sysfs(tmp_path)
    info = describe(BDF, tmp_path)
    with pytest.raises(DeviceError, match="has no IOMMU group .* the machine's IOMMU is off"):
        vfio.VfioDevice(info, {0}, dev_vfio=tmp_path / "dev-vfio")


def test_a_group_without_its_node_is_refused(tmp_path):
    dev = make_sysfs(tmp_path)
    groups = tmp_path / "kernel/iommu_groups/7"
    groups.mkdir(parents=True)
    (dev / "iommu_group").symlink_to(groups)
    (tmp_path / "dev-vfio").mkdir()
    info = describe(BDF, tmp_path)
    with pytest.raises(DeviceError, match=r"no .*dev-vfio/7 \(vfio-pci not bound"):
        vfio.VfioDevice(info, {0}, dev_vfio=tmp_path / "dev-vfio")


def test_vfio_pci_is_not_a_driver_to_refuse_but_the_way_in(tmp_path, capsys, monkeypatch):
    """A device bound to vfio-pci is opened through VFIO (here, with no
    IOMMU group, refused for that), where another driver is refused."""
    from mmiotrace_ng.replay import command

    monkeypatch.setattr(command, "describe",
                        lambda bdf, root: describe(bdf, tmp_path / "sys"))
    trace = write_trace(tmp_path, TRACE)
    for driver, said in (("vfio-pci", "is bound to vfio-pci but has no IOMMU group"),
                         ("edu_exerciser", "is bound to the driver edu_exerciser")):
        shutil.rmtree(tmp_path / "sys", ignore_errors=True)
        make_sysfs(tmp_path / "sys", driver=driver)
        capsys.readouterr()
        assert cli.main(["replay", trace, "--pci", BDF]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
