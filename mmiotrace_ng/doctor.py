"""mmiotrace-ng check: whether this machine can trace, one line per
requirement (common/requirements.py), with what is missing and how to fix
it.  Exit status 0: every check passed, 2: one failed (a warning, where the
answer is not known, does not fail).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .common.requirements import Check, run_checks


def format_check(c: Check) -> str:
    word = {True: "ok", False: "MISSING", None: "warning"}[c.ok]
    return f"{word:8} {c.name}: {c.detail}"


def setup(ap: argparse.ArgumentParser) -> None:
    from .common.helpformat import ExamplesFormatter

    ap.epilog = ("exit status:\n  0 every check passed (warnings say what may still be "
                 "needed), 2 one failed")
    ap.formatter_class = ExamplesFormatter


def run(args: argparse.Namespace) -> int:
    ko = Path(__file__).resolve().parents[1] / "kmod" / "mmiotng.ko"
    checks = run_checks(checkout_ko=ko)
    for c in checks:
        print(format_check(c))
    return 2 if any(c.ok is False for c in checks) else 0
