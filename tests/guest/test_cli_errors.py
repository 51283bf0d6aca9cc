"""Bad input and unusable environments: one clear line, exit 2, nothing left armed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from kernel_tracer import KernelMmiotrace
from ng_tracer import NG, helper_status

TRACER = Path("/sys/kernel/tracing/current_tracer")


def run(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, *NG, *args, "--", "true"], capture_output=True, text=True,
                          timeout=600)


def assert_refused(res: subprocess.CompletedProcess, words: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines and words in lines[-1].lower(), res.stderr
    if Path("/sys/module/mmiotng").exists():
        st = helper_status()
        assert st["armed_pages"] == 0 and st["filters"] == 0 and st["owner"] == 0


def device_without_bars() -> str:
    for dev in sorted(Path("/sys/bus/pci/devices").iterdir()):
        rows = (dev / "resource").read_text().splitlines()[:6]
        if all(int(r.split()[2], 16) & 0x200 == 0 for r in rows):
            return dev.name
    pytest.fail("no PCI device without memory BARs in this VM")


@pytest.mark.parametrize("bdf,words", [
    ("zz:00.0", "pci address"),
    ("00:1f.9", "pci address"),
    ("0000:7f:1f.0", "no pci device"),
])
def test_bad_pci_address(bdf, words):
    assert_refused(run("--pci", bdf), words)


def test_device_without_memory_bars():
    assert_refused(run("--pci", device_without_bars()), "no memory bars")


def test_not_root(exerciser):
    res = run("--pci", exerciser.dev.name, prefix=("setpriv", "--reuid=65534", "--regid=65534",
                                                    "--clear-groups"))
    assert_refused(res, "root")


def test_kernel_mmiotrace_active(exerciser):
    kt = KernelMmiotrace()
    kt.start()
    try:
        res = run("--pci", exerciser.dev.name)
    finally:
        kt.stop()
    assert_refused(res, "kernel's own mmiotrace")
    assert TRACER.read_text().strip() == "nop"


def test_usage_without_device():
    res = subprocess.run([*NG], capture_output=True, text=True)
    assert res.returncode == 2 and "--pci" in res.stderr


def test_help_has_examples():
    res = subprocess.run([*NG, "--help"], capture_output=True, text=True)
    assert res.returncode == 0
    assert "examples:" in res.stdout and "--pci 01:00.0 -- modprobe" in res.stdout


def test_check_passes_in_the_test_vm_and_says_the_kernels_tracer():
    """mmiotrace-ng check on a machine that traces (the test VM): every
    line ok (the module-signature line may warn), exit 0; with the kernel's
    own mmiotrace on, that line says MISSING with the fix, exit 2."""
    res = subprocess.run([*NG, "check"], capture_output=True, text=True, timeout=120)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) >= 12 and all(ln.split()[0] in ("ok", "warning") for ln in lines), lines
    assert [ln for ln in lines if ln.startswith("warning")] == [], lines
    with KernelMmiotrace():
        res = subprocess.run([*NG, "check"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout
    (missing,) = [ln for ln in res.stdout.splitlines() if ln.startswith("MISSING")]
    assert "kernel's mmiotrace: active: echo nop" in missing, missing
