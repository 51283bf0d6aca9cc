"""The recordings the guest tests made for the host in this run of
tests/run (tests/guest/ng_tracer.py, recorded_for_host), and the checkout's
mmiotrace-ng to read them with."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "artifacts" / "recorded"
NG = [sys.executable, "-m", "mmiotrace_ng"]
os.environ["PYTHONPATH"] = str(REPO) + (":" + os.environ["PYTHONPATH"]
                                        if os.environ.get("PYTHONPATH") else "")
FRESH_S = 3 * 3600     # tests/run removes the directory before the guests


def recording(name: str) -> tuple[Path, dict]:
    """The recording and the facts the guest test wrote beside it (the
    device's address, its BAR 0); a failure if the guest test did not make
    it in this run."""
    rec, facts = RECORDED / f"{name}.rec", RECORDED / f"{name}.json"
    if not rec.exists() or not facts.exists():
        pytest.fail(f"{rec} is missing: a guest test makes it (recorded_for_host(\"{name}\", "
                    "...) in tests/guest), in this run of tests/run", pytrace=False)
    made = json.loads(facts.read_text())
    if time.time() - made["made"] > FRESH_S:
        pytest.fail(f"{rec} is stale (made {time.ctime(made['made'])})", pytrace=False)
    return rec, made
