"""Skip for want of a tool or source, except under tests/run, which installs
everything the suite needs (MMIOTNG_REQUIRE_ALL=1, or CI set): there a
missing piece is a failure, not a silent skip."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def required() -> bool:
    return os.environ.get("MMIOTNG_REQUIRE_ALL") == "1" or bool(os.environ.get("CI"))


def missing(reason: str) -> None:
    if required():
        pytest.fail(f"{reason} (tests/run installs it, so it must be there)", pytrace=False)
    pytest.skip(reason)


def guest_kernel() -> str:
    """The kernel the test guest boots: tests/run passes it in MMIOTNG_KVER;
    tests/default-kernel otherwise."""
    return os.environ.get("MMIOTNG_KVER") or subprocess.run(
        [str(REPO / "tests" / "default-kernel")], capture_output=True, text=True,
        check=True).stdout.strip()
