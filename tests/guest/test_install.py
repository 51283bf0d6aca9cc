"""The tool as users install it: the wheel built from this repository
(tests/setup.sh puts it in tests/artifacts/dist), installed into a fresh
venv outside the repository, run from /, with the helper module built on
first use from the sources the wheel ships."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import EXERCISER_DEBUGFS
from ng_tracer import REPO

DIST = REPO / "tests" / "artifacts" / "dist"


def rmmod_helper() -> None:
    if Path("/sys/module/mmiotng").exists():
        subprocess.run(["rmmod", "mmiotng"], check=True, timeout=120)


def test_installed_wheel_traces_with_a_helper_built_on_first_use(exerciser, tmp_path):
    wheels = sorted(DIST.glob("mmiotrace_ng-*.whl"))
    if not wheels:
        pytest.fail(f"no wheel in {DIST}: tests/setup.sh builds it", pytrace=False)
    venv = tmp_path / "venv"
    # nothing of the checkout on the path (the guest's PYTHONPATH names it)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"
    env["MMIOTNG_BUILD_DIR"] = str(tmp_path / "helper-build")
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, env=env, cwd="/")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index",
                    "--find-links", str(DIST), "mmiotrace-ng"], check=True, timeout=600,
                   env=env, cwd="/")
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import mmiotrace_ng; print(mmiotrace_ng.__file__)"],
                           cwd="/", env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(venv)), where.stdout
    rmmod_helper()
    try:
        res = subprocess.run(["mmiotrace-ng", "--pci", exerciser.dev.name, "--", "sh", "-c",
                              f"echo readl > {EXERCISER_DEBUGFS / 'run'}"],
                             cwd="/", env=env, capture_output=True, text=True, timeout=1200)
        assert res.returncode == 0, res.stderr
        assert "building the helper module" in res.stderr, res.stderr
        assert (tmp_path / "helper-build" / "mmiotng.ko").exists()
        reads = re.findall(rf"^R 4 \S+ \d+ 0x{exerciser.bar0[0]:x} 0x10000ed ", res.stdout, re.M)
        assert len(reads) == 1, res.stdout
        assert res.stdout.startswith("VERSION 20070824\n")
    finally:
        rmmod_helper()
        subprocess.run(["insmod", str(REPO / "kmod" / "mmiotng.ko")], check=True)
