"""Host tests.  Under CI (CI set) a skipped host test is a failure: every
prerequisite (kernel source, headers, vagrant) is installed by tests/setup.sh,
so a skip there would hide a broken setup.

``kernel_source`` (session): a directory holding KERNEL_FILES of Debian's
linux-source-6.1, unpacked from its tarball in one pass (or an unpacked tree
named by $MMIOTNG_KSRC); skips if there is none.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ng_require import missing

KERNEL_TARBALL = Path(os.environ.get("MMIOTNG_KERNEL_TARBALL",
                                     "/usr/src/linux-source-6.1.tar.xz"))
KERNEL_TOP = "linux-source-6.1"
KERNEL_FILES = [
    "arch/x86/mm/pf_in.c", "arch/x86/mm/pf_in.h",           # decoder oracle
    "kernel/trace/trace_mmiotrace.c", "drivers/pci/proc.c",   # format strings
    "scripts/checkpatch.pl", "scripts/spelling.txt", "scripts/const_structs.checkpatch",
]


@pytest.fixture(scope="session")
def kernel_source(tmp_path_factory) -> Path:
    tree = os.environ.get("MMIOTNG_KSRC")
    if tree and all((Path(tree) / f).exists() for f in KERNEL_FILES):
        return Path(tree)
    if not KERNEL_TARBALL.exists():
        missing(f"no kernel source: {KERNEL_TARBALL} (apt-get install linux-source-6.1)")
    out = tmp_path_factory.mktemp("ksrc")
    # one pass: each tar run decompresses the whole 130 MB tarball
    subprocess.run(["tar", "-xf", str(KERNEL_TARBALL), "-C", str(out),
                    *(f"{KERNEL_TOP}/{f}" for f in KERNEL_FILES)],
                   check=True, capture_output=True, timeout=900)
    return out / KERNEL_TOP


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (a missing prerequisite?): {report.longrepr}"
