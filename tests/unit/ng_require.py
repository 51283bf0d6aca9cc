"""Skip for want of a tool or source, except under tests/run, which installs
everything the suite needs (MMIOTNG_REQUIRE_ALL=1, or CI set): there a
missing piece is a failure, not a silent skip."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def required() -> bool:
    return os.environ.get("MMIOTNG_REQUIRE_ALL") == "1" or bool(os.environ.get("CI"))


def missing(reason: str) -> None:
    if required():
        pytest.fail(f"{reason} (tests/run installs it, so it must be there)", pytrace=False)
    pytest.skip(reason)


def release_lacks(debian_package: str | None) -> bool:
    """Whether the tests run on a Debian release's root (tests/run --suite:
    tests/vm/in-root says which in MMIOTNG_SUITE) that is not made with
    this package (None: a module no Debian package has): there the module
    is absent by the release's own choice, not by a missing install step."""
    suite = os.environ.get("MMIOTNG_SUITE")
    if not suite:
        return False
    sys.path.insert(0, str(REPO / "tests" / "vm"))
    try:
        import suites
    finally:
        sys.path.pop(0)
    return debian_package is None or debian_package not in suites.get(suite).packages()


def optional(module: str, debian_package: str | None, reason: str) -> ModuleType:
    """The module, which an optional extra brings (pyproject.toml); if it
    cannot be imported: a skip where the release's root lacks it (the test
    of what the command says without it runs there instead), else
    missing(reason)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if release_lacks(debian_package):
            pytest.skip(f"{reason}: this release has no {debian_package or 'package of it'}; "
                        "the test of the command's message without it runs instead")
        missing(reason)
        raise


def guest_kernel() -> str:
    """The kernel the test guest boots: tests/run passes it in MMIOTNG_KVER;
    tests/default-kernel otherwise."""
    return os.environ.get("MMIOTNG_KVER") or subprocess.run(
        [str(REPO / "tests" / "default-kernel")], capture_output=True, text=True,
        check=True).stdout.strip()
