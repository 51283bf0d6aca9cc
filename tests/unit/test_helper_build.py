"""The helper built on first use, as the installed tool builds it when
neither a checkout's build nor DKMS has one: for the kernel the test guest
boots (MMIOTNG_KVER; tests/default-kernel otherwise), into
tests/artifacts/helper-build, which the guest test loads
(tests/guest/test_install.py).  The guest's root is this one (a release's
root under tests/run --suite, where these tests run too), so the build is
the one the guest would make; here it takes seconds, under TCG minutes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ng_require import guest_kernel, missing

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / "tests" / "artifacts" / "installed"
OUT = REPO / "tests" / "artifacts" / "helper-build"
BUILD = "from mmiotrace_ng.tracer.kmodload import _build; print(_build('{kver}'))"


def installed_python(code: str, build_dir: Path) -> subprocess.CompletedProcess[str]:
    """code run by the installed tool's Python, nothing of the checkout on
    its path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MMIOTNG_BUILD_DIR"] = str(build_dir)
    return subprocess.run([str(VENV / "bin" / "python"), "-c", code], cwd="/", env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def built() -> tuple[str, subprocess.CompletedProcess[str]]:
    kver = guest_kernel()
    if os.geteuid() != 0:
        missing("needs root (the build directory must be root's)")
    if not Path(f"/lib/modules/{kver}/build").is_dir():
        missing(f"no headers for {kver}")
    if not (VENV / "bin" / "python").exists():
        missing(f"no {VENV}: tests/setup.sh installs the wheel there")
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    res = installed_python(BUILD.format(kver=kver), OUT)
    assert res.returncode == 0, res.stderr
    (OUT.parent / "helper-build.kernel").write_text(kver + "\n")
    return kver, res


def test_first_use_builds_the_helper_for_the_kernel(built):
    kver, res = built
    assert res.stderr == f"mmiotrace-ng: building the helper module for {kver} ...\n"
    ko = Path(res.stdout.strip())
    assert ko == OUT / "mmiotng.ko"
    vermagic = subprocess.run(["modinfo", "-F", "vermagic", str(ko)], capture_output=True,
                              text=True, check=True).stdout
    assert vermagic.split()[0] == kver, vermagic


def test_a_second_use_loads_that_build(built):
    kver, first = built
    ko = OUT / "mmiotng.ko"
    before = ko.stat().st_mtime_ns
    again = installed_python(BUILD.format(kver=kver), OUT)
    assert (again.returncode, again.stderr, again.stdout) == (0, "", first.stdout)
    assert ko.stat().st_mtime_ns == before


def test_other_sources_or_a_directory_others_may_write_build_anew(built, tmp_path):
    kver, _ = built
    copy = tmp_path / "build"
    subprocess.run(["cp", "-a", str(OUT), str(copy)], check=True)
    check = ("from pathlib import Path; from mmiotrace_ng.tracer import kmodload as k; "
             f"print(k._built_before(Path({str(copy)!r}), k._sources_digest({kver!r}), "
             f"{kver!r}))")
    assert installed_python(check, copy).stdout == "True\n"
    copy.chmod(0o777)
    assert installed_python(check, copy).stdout == "False\n"
    copy.chmod(0o755)
    stamp = copy / ".mmiotrace-ng-built-from"
    stamp.write_text("0" * 64)
    assert installed_python(check, copy).stdout == "False\n"
    stamp.unlink()
    assert installed_python(check, copy).stdout == "False\n"
