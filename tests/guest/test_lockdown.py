"""A kernel that loads signed modules only, then locked down: these tests
run in tests/run's third boot (module.sig_enforce=1 on the kernel's command
line; conftest.py selects them there and only there).

The helper built on the machine is not signed: a trace is refused in one
line that says why and how to sign it, and `check` warns of it.  Lockdown
raised to confidentiality (it cannot be lowered again: the last test)
refuses tracing as such.  Nothing is loaded or armed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import EDU_ID
from kernel_tracer import find_pci_device
from ng_tracer import NG

pytestmark = pytest.mark.lockdown_boot
LOCKDOWN = Path("/sys/kernel/security/lockdown")


def ng(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NG, *args], capture_output=True, text=True, timeout=600)


def refused_in_one_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert not Path("/sys/module/mmiotng").exists(), "the helper got loaded"
    return lines[0]


def test_an_unsigned_helper_is_refused_in_one_line_that_says_how_to_sign_it():
    dev = find_pci_device(*EDU_ID)
    assert dev is not None, "boot the test VM with QEMU's edu device"
    line = refused_in_one_line(ng("--pci", dev.name, "--", "true"))
    assert line.startswith("mmiotrace-ng: the kernel refused the helper module: "
                           "module.sig_enforce=1: the helper loads only if signed"), line
    assert "mokutil --import" in line, line


def test_check_warns_that_modules_must_be_signed():
    res = ng("check")
    assert res.returncode == 0, res.stdout
    warn = [ln for ln in res.stdout.splitlines() if ln.startswith("warning")]
    assert len(warn) == 1 and warn[0].startswith(
        "warning  module signatures: module.sig_enforce=1"), res.stdout


def test_lockdown_for_confidentiality_refuses_tracing():
    """Raised now (it stays so until the next boot: this test runs last)."""
    if not LOCKDOWN.exists():       # securityfs, which systemd mounts
        subprocess.run(["mount", "-t", "securityfs", "securityfs", "/sys/kernel/security"],
                       check=True)
    assert "[none]" in LOCKDOWN.read_text(), LOCKDOWN.read_text()
    LOCKDOWN.write_text("confidentiality\n")
    assert "[confidentiality]" in LOCKDOWN.read_text()
    res = ng("check")
    assert res.returncode == 2, res.stdout
    (missing,) = [ln for ln in res.stdout.splitlines() if ln.startswith("MISSING")]
    assert missing.startswith("MISSING  lockdown: confidentiality: the kernel refuses"), missing
    dev = find_pci_device(*EDU_ID)
    line = refused_in_one_line(ng("--pci", dev.name, "--", "true"))
    assert line.startswith("mmiotrace-ng: the kernel is locked down, confidentiality: "), line
