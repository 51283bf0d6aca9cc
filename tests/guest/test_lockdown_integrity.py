"""A kernel locked down for integrity from its boot (lockdown=integrity, as
on a Secure Boot machine): these tests run in tests/run's fourth boot
(conftest.py selects them there and only there).

Only signed modules load, and the helper built on the machine is not
signed: a trace is refused in one line that names the lockdown and says how
to sign the helper, `check` warns of it, and nothing is loaded or armed.
"""

from __future__ import annotations

import subprocess

import pytest
from conftest import EDU_ID
from kernel_tracer import find_pci_device
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
