"""The kernel code builds with zero warnings (W=1) and is checkpatch-clean."""

from __future__ import annotations

import glob
import os
import re
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


# every kernel whose headers are installed: on a suite's root (tests/run
# --suite) that is each of the release's kernels, -rt flavours included
KERNELS = sorted(Path(p).parent.name for p in glob.glob("/lib/modules/*/build"))


def kbuild_dir() -> Path:
    """The headers of the kernel under test (tests/run sets MMIOTNG_KVER),
    else of the last installed one."""
    kver = os.environ.get("MMIOTNG_KVER") or (KERNELS[-1] if KERNELS else "")
    if not kver or not (Path("/lib/modules") / kver / "build").is_dir():
        missing("no kernel headers (linux-headers-amd64)")
    return Path("/lib/modules") / kver / "build"


@pytest.mark.parametrize("kver", KERNELS or ["none"])
@pytest.mark.parametrize("subdir", list(SOURCES))
def test_builds_without_warnings(subdir, kver, tmp_path):
    kdir = Path("/lib/modules") / kver / "build"
    if not kdir.is_dir():
        missing("no kernel headers (linux-headers-amd64)")
    # the checkout's layout: the test driver includes kmod/mmiotng_compat.h
    built = shutil.ignore_patterns("*.o", "*.ko", "*.mod*", ".*")
    for d in {subdir, "kmod"}:
        shutil.copytree(REPO / d, tmp_path / d, ignore=built)
    work = tmp_path / subdir
    out = subprocess.run(["make", "-C", str(kdir), f"M={work}", "W=1", "modules"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    warnings = [ln for ln in (out.stdout + out.stderr).splitlines() if "warning:" in ln]
    assert not warnings, "\n".join(warnings)
    assert list(work.glob("*.ko"))


@pytest.fixture(scope="module")
def checkpatch(kernel_source: Path) -> Path:
    return kernel_source / "scripts" / "checkpatch.pl"


# What checkpatch says of an X-macro list, allowed on that list's line
# alone (the kernel's own lists, e.g. i915's I915_PARAMS_FOR_EACH, draw the
# same): (file, start of the line, message).
ALLOWED = {
    ("mmiotng_abi.h", "#define MMIOTNG_ATTRS(X)", "ERROR: Macros with complex values "
     "should be enclosed in parentheses"),
    ("mmiotng_abi.h", "#define MMIOTNG_ATTRS(X)", "CHECK: Macro argument reuse 'X' - "
     "possible side-effects?"),
}


def checkpatch_findings(checkpatch: Path, files: list[Path]) -> list[str]:
    """checkpatch's findings that ALLOWED does not cover, one line each."""
    out = subprocess.run(["perl", str(checkpatch), "--no-tree", "--strict", "--ignore",
                          "SPDX_LICENSE_TAG,FILE_PATH_CHANGES,VOLATILE", "-f", *map(str, files)],
                         capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert len([ln for ln in lines if ln.startswith("total:")]) == len(files), out.stdout
    findings = []
    for msg, where in zip(lines, lines[1:], strict=False):
        m = re.match(r"#\d+: FILE: (.*):(\d+):$", where)
        if not re.match(r"(ERROR|WARNING|CHECK): ", msg) or not m:
            continue
        path = Path(m[1])
        text = path.read_text().splitlines()[int(m[2]) - 1]
        if not any(path.name == f and text.startswith(start) and msg == allowed
                   for f, start, allowed in ALLOWED):
            findings.append(f"{path.name}:{m[2]}: {msg}")
    return findings


@pytest.mark.parametrize("subdir", list(SOURCES))
def test_checkpatch_clean(subdir, checkpatch):
    files = [REPO / subdir / f for f in SOURCES[subdir]]
    assert checkpatch_findings(checkpatch, files) == []


def test_checkpatch_findings_are_seen(checkpatch, tmp_path):
    """The allowance is for that one line: the same macro elsewhere, or
    another finding on it, is reported."""
    src = (REPO / "kmod" / "mmiotng_abi.h").read_text()
    bad = tmp_path / "mmiotng_abi.h"
    bad.write_text(src.replace("#define MMIOTNG_ATTRS(X)", "#define MMIOTNG_ATTRS(X) ", 1)
                   .replace("#endif /* MMIOTNG_ABI_H */",
                            "#define NG_LIST(X) X(1) X(2)\n\n#endif /* MMIOTNG_ABI_H */"))
    found = checkpatch_findings(checkpatch, [bad])
    lines = bad.read_text().splitlines()
    at = {int(f.split(":")[1]) for f in found}
    assert lines[min(at) - 1].startswith("#define MMIOTNG_ATTRS(X) "), found
    assert any("complex values" in f and lines[int(f.split(":")[1]) - 1].startswith(
        "#define NG_LIST") for f in found), found
