"""The 15-second version of tests/storm (tests/guest/storm.py): a two-CPU
access storm whose output is counted line by line; records in the output
plus the reported losses equal the records made, the tracer exits 0 and
leaves the helper empty."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import stress_length

HERE = Path(__file__).resolve().parent


def test_storm_counted_in_the_output(exerciser):
    seconds = stress_length(10)
    res = subprocess.run([sys.executable, str(HERE / "storm.py"), "--seconds", f"{seconds:g}"],
                         capture_output=True, text=True, timeout=600)
    print(res.stdout, res.stderr)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "records made; in the output:" in res.stdout
