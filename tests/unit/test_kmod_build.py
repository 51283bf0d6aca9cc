"""The kernel code builds with zero warnings (W=1) and is checkpatch-clean."""

from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path

import pytest
from ng_require import missing

REPO = Path(__file__).resolve().parents[2]
TARBALL = Path("/usr/src/linux-source-6.1.tar.xz")
SOURCES = {
    "kmod": sorted(p.name for p in (REPO / "kmod").iterdir() if p.suffix in (".c", ".h")
                   and not p.name.endswith(".mod.c")),
    "tests/drivers/edu_exerciser": ["edu_exerciser.c"],
}


def kbuild_dir() -> Path:
    dirs = sorted(glob.glob("/lib/modules/*-amd64/build"))
    if not dirs:
        missing("no kernel headers (linux-headers-amd64)")
    return Path(dirs[-1])


@pytest.mark.parametrize("subdir", list(SOURCES))
def test_builds_without_warnings(subdir, tmp_path):
    src = REPO / subdir
    work = tmp_path / "src"
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("*.o", "*.ko", "*.mod*", ".*"))
    out = subprocess.run(["make", "-C", str(kbuild_dir()), f"M={work}", "W=1", "modules"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    warnings = [ln for ln in (out.stdout + out.stderr).splitlines() if "warning:" in ln]
    assert not warnings, "\n".join(warnings)
    assert list(work.glob("*.ko"))


@pytest.fixture(scope="module")
def checkpatch(kernel_source: Path) -> Path:
    return kernel_source / "scripts" / "checkpatch.pl"


@pytest.mark.parametrize("subdir", list(SOURCES))
def test_checkpatch_clean(subdir, checkpatch):
    files = [str(REPO / subdir / f) for f in SOURCES[subdir]]
    out = subprocess.run(["perl", str(checkpatch), "--no-tree", "--strict", "--ignore",
                          "SPDX_LICENSE_TAG,FILE_PATH_CHANGES,VOLATILE", "-f", *files],
                         capture_output=True, text=True)
    totals = [ln for ln in out.stdout.splitlines() if ln.startswith("total:")]
    assert len(totals) == len(files)
    assert all(t.startswith("total: 0 errors, 0 warnings, 0 checks") for t in totals), out.stdout
