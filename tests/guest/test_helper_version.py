"""A helper module of another interface version left loaded (an older
mmiotrace-ng's): mmiotrace-ng replaces it when nobody uses it, and refuses
with a clear message (exit 2) while another tracer does.

tests/setup.sh builds the stale helper: the same sources, built with
MMIOTNG_ABI_VERSION=1.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from held import ensure_helper
from kernel_tracer import to_records
from ng_tracer import NG, REPO, NgTracer, helper_status

import mmiotrace_ng.tracer.netlink as nl
from mmiotrace_ng.format.abi import MMIOTNG_ABI_VERSION

STALE_KO = REPO / "tests" / "artifacts" / "stale-helper" / "mmiotng.ko"


def load_stale() -> None:
    if not STALE_KO.exists():
        pytest.fail(f"{STALE_KO} is missing: tests/setup.sh builds it", pytrace=False)
    if Path("/sys/module/mmiotng").exists():
        subprocess.run(["rmmod", "mmiotng"], check=True)
    subprocess.run(["insmod", str(STALE_KO)], check=True)
    assert helper_status()["abi_version"] == 1


def test_stale_helper_is_replaced(exerciser):
    load_stale()
    t = NgTracer(["--pci", exerciser.dev.name], "ng-stale").start()
    try:
        assert helper_status()["abi_version"] == MMIOTNG_ABI_VERSION
        text = t.section(lambda: exerciser.run("readl"))
    finally:
        assert t.stop() == 0
    assert "replacing the loaded helper module (interface 1" in t.stderr()
    assert [r for r in to_records(text, exerciser.bar0[0]) if r[0] == "R"] == [
        ("R", 4, 0x00, 0x010000ED), ("R", 4, 0x20, 0), ("R", 4, 0x24, 0),
        ("R", 4, 0x40, 0xFFFFFFFF)]


def test_stale_helper_in_use_is_refused(exerciser, tmp_path):
    load_stale()
    start, length = exerciser.bar0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                     # another tracer: a session on the stale helper
        try:
            os.close(r)
            h = nl.HelperSocket()
            h.filter_add(start, length)
            os.write(w, b"armed\n")
            signal.pause()
        finally:
            os._exit(1)
    os.close(w)
    try:
        assert os.read(r, 16) == b"armed\n"
        res = subprocess.run([*NG, "--pci", exerciser.dev.name, "-o", str(tmp_path / "x.txt"),
                              "--", "true"], capture_output=True, text=True, timeout=300)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "another version" in lines[0] and "using it" in lines[0], lines
        assert helper_status()["abi_version"] == 1      # left alone
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
    st = helper_status()
    assert st["owner"] == 0 and st["armed_pages"] == 0, st
    subprocess.run(["rmmod", "mmiotng"], check=True)
    ensure_helper()
    assert helper_status()["abi_version"] == MMIOTNG_ABI_VERSION
