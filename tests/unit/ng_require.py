"""Skip for want of a tool or source, except under tests/run, which installs
everything the suite needs (MMIOTNG_REQUIRE_ALL=1, or CI set): there a
missing piece is a failure, not a silent skip."""

from __future__ import annotations

import os

import pytest


def required() -> bool:
    return os.environ.get("MMIOTNG_REQUIRE_ALL") == "1" or bool(os.environ.get("CI"))


def missing(reason: str) -> None:
    if required():
        pytest.fail(f"{reason} (tests/run installs it, so it must be there)", pytrace=False)
    pytest.skip(reason)
