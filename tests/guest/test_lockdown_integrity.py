"""A kernel locked down for integrity from its boot (lockdown=integrity, as
on a Secure Boot machine): these tests run in tests/run's fourth boot
(conftest.py selects them there and only there).

Only signed modules load, and the helper built on the machine is not
signed: a trace is refused in one line that names the lockdown and says how
to sign the helper, `check` warns of it, and nothing is loaded or armed.

Lockdown also refuses the mapping of a BAR through sysfs, not through VFIO
with an IOMMU (this boot's machine has QEMU's intel-iommu, the kernel
intel_iommu=on): `replay` of a trace to edu bound to vfio-pci makes its
accesses, the device computes the factorial (polled for) again, every read
matches.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import EDU_ID
from kernel_tracer import find_pci_device
from ng_tracer import ARTIFACTS
from test_lockdown import LOCKDOWN, ng, refused_in_one_line

pytestmark = pytest.mark.integrity_boot


@pytest.fixture(autouse=True, scope="module")
def securityfs() -> None:
    """Mounted, as systemd mounts it on a user's machine (the test VM's init
    does not): where the tool reads the lockdown mode."""
    if not LOCKDOWN.exists():
        subprocess.run(["mount", "-t", "securityfs", "securityfs", "/sys/kernel/security"],
                       check=True)


def test_the_kernel_is_locked_down_for_integrity():
    assert "[integrity]" in LOCKDOWN.read_text(), LOCKDOWN.read_text()


def test_an_unsigned_helper_is_refused_in_one_line_that_names_the_lockdown():
    dev = find_pci_device(*EDU_ID)
    assert dev is not None, "boot the test VM with QEMU's edu device"
    line = refused_in_one_line(ng("--pci", dev.name, "--", "true"))
    assert line.startswith("mmiotrace-ng: the kernel refused the helper module: lockdown is "
                           "integrity: only signed modules load"), line
    assert "mokutil --import" in line, line


def test_check_warns_that_the_helper_must_be_signed():
    """And that the kprobes switch cannot be read: lockdown closes debugfs's
    writable files (mounted here, as the test VM mounts it)."""
    res = ng("check")
    assert res.returncode == 0, res.stdout
    warn = [ln for ln in res.stdout.splitlines() if ln.startswith("warning")]
    assert warn == [
        "warning  kprobes switch: not known: /sys/kernel/debug/kprobes/enabled cannot be read "
        "(lockdown closes debugfs's writable files)",
        "warning  lockdown: integrity: only signed modules load; the helper must be signed "
        "(install-helper, then DKMS signs it with its key; enroll the key with mokutil "
        "--import)"], res.stdout


# edu busy for tens of milliseconds, so the replay's poll always sees it
# busy first (12! came before the first read of the status in one run); the
# register holds N until the result replaces it: 0 = 2^26! mod 2^32
FACT_N, FACT_OF_N = 1 << 26, 0
WVAL = 0x5EED


def vfio_trace(base: int) -> str:
    """A trace of edu's registers (edu's own semantics: liveness reads the
    inverse of its last write, the factorial register the factorial once
    the status is idle): no PCIDEV line, so the MAP's address must be the
    BAR's."""
    line = "R 4 1.{:06d} 1 {:#x} {:#x} 0x0 7\n"
    return ("VERSION 20070824\n"
            f"MAP 1.000000 1 {base:#x} 0xffffc90000100000 0x100000 0x0 0\n"
            + line.format(1, base, 0x010000ED)                        # identification
            + line.replace("R", "W", 1).format(2, base + 0x04, 0x12345678)
            + line.format(3, base + 0x04, 0xEDCBA987)
            + line.replace("R", "W", 1).format(4, base + 0x08, FACT_N)
            + line.format(5, base + 0x20, 0x1)                        # a poll of the status
            + line.format(6, base + 0x20, 0x0)
            + line.format(7, base + 0x08, FACT_OF_N)
            + line.replace("R", "W", 1).format(8, base + 0x80, WVAL)
            + line.format(9, base + 0x80, WVAL)
            + "UNMAP 1.000010 1 0x0 7\n")


def driver_of(dev: Path) -> str | None:
    link = dev / "driver"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def bind_vfio(dev: Path) -> None:
    res = subprocess.run(["modprobe", "vfio-pci"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    if driver_of(dev):
        (dev / "driver" / "unbind").write_text(dev.name)
    (dev / "driver_override").write_text("vfio-pci")
    Path("/sys/bus/pci/drivers_probe").write_text(dev.name)
    assert driver_of(dev) == "vfio-pci"


def unbind_vfio(dev: Path) -> None:
    if driver_of(dev) == "vfio-pci":
        (dev / "driver" / "unbind").write_text(dev.name)
    (dev / "driver_override").write_text("\n")


def test_replay_through_vfio_where_lockdown_refuses_sysfs():
    found = find_pci_device(*EDU_ID)
    assert found is not None, "boot the test VM with QEMU's edu device"
    dev = Path("/sys/bus/pci/devices") / found.name
    assert (dev / "iommu_group").is_symlink(), "boot with -device intel-iommu, intel_iommu=on"
    base = int((dev / "resource").read_text().split()[0], 16)
    out = ARTIFACTS / "replay-vfio"
    out.mkdir(parents=True, exist_ok=True)
    trace, replayed = out / "trace.txt", out / "replayed.txt"
    trace.write_text(vfio_trace(base))
    replayed.unlink(missing_ok=True)
    bind_vfio(dev)
    try:
        # the sysfs way is closed
        fd = os.open(dev / "resource0", os.O_RDWR | os.O_SYNC)
        try:
            with pytest.raises(OSError) as refused:
                mmap.mmap(fd, 4096)
        finally:
            os.close(fd)
        assert refused.value.errno == errno.EPERM
        res = ng("replay", str(trace), "--pci", found.name, "--poll-timeout", "10",
                 "-o", str(replayed))
        assert res.returncode == 0, res.stderr
        group = os.path.basename(os.readlink(dev / "iommu_group"))
        said = res.stderr.splitlines()
        assert said[0] == (f"mmiotrace-ng: replay: {found.name}: through VFIO (IOMMU group "
                           f"{group})"), res.stderr
        # the status poll's reads: as many as edu took
        m = re.fullmatch(rf"mmiotrace-ng: replay: {found.name}: 3 writes, (\d+) reads"
                         r" \(1 polls\): every read as recorded", said[1])
        assert m and int(m[1]) >= 6, res.stderr
        assert len(said) == 2, res.stderr
        # what was done, as the trace says it
        assert ng("diff", "--ignore-header", str(trace), str(replayed)).returncode == 0
    finally:
        unbind_vfio(dev)
