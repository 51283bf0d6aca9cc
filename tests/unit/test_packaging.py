"""What the wheel ships: the BPF and helper sources the installed tool
builds from, and a dkms.conf that DKMS can use for this version."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mmiotrace_ng
from mmiotrace_ng.tracer import kmodload

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools' scratch: the files an earlier build listed would ship
    for scratch in (REPO / "build", REPO / "mmiotrace_ng.egg-info"):
        shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(REPO)], check=True)
    (whl,) = out.glob("mmiotrace_ng-*.whl")
    return zipfile.ZipFile(whl)


def test_wheel_ships_every_source(wheel):
    names = set(wheel.namelist())
    pkg = REPO / "mmiotrace_ng"
    for src in pkg.rglob("*.py"):
        assert f"mmiotrace_ng/{src.relative_to(pkg)}" in names, src
    for sub, patterns in (("bpf", ["*.c", "*.h"]),
                          ("kmod", ["*.c", "*.h", "Kbuild", "Makefile", "dkms.conf"])):
        for pattern in patterns:
            for src in (REPO / sub).glob(pattern):
                if src.name.endswith(".mod.c"):
                    continue
                assert f"mmiotrace_ng/data/{sub}/{src.name}" in names, src
    assert not [n for n in names if n.endswith((".ko", ".o", ".mod.c"))]


def test_dkms_conf_names_this_version_and_module():
    conf = (REPO / "kmod" / "dkms.conf").read_text()
    assert kmodload.dkms_version() == mmiotrace_ng.__version__
    assert re.search(r'^BUILT_MODULE_NAME\[0\]="mmiotng"$', conf, re.M)
    assert re.search(r'^PACKAGE_NAME="mmiotng"$', conf, re.M)


def test_wheel_ships_the_manual_pages(wheel):
    """pip installs them into PREFIX/share/man/man1 (man finds a venv's when
    its bin is on PATH)."""
    names = set(wheel.namelist())
    pages = sorted((REPO / "docs" / "man").glob("*.1"))
    assert pages
    for page in pages:
        assert f"mmiotrace_ng-{mmiotrace_ng.__version__}.data/data/share/man/man1/{page.name}" \
            in names, page.name
