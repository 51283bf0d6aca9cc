"""start: which command lines begin getting the BPF programs early."""

from __future__ import annotations

import pytest

from mmiotrace_ng import start


@pytest.mark.parametrize("argv,want", [
    (["--pci", "01:00.0"], True),
    (["--pci", "01:00.0", "--", "modprobe", "--help"], True),   # the command's own --help
    (["record", "--pci", "01:00.0", "-o", "x"], True),
    (["--all", "-o", "out.txt"], True),
    ([], False),
    (["--help"], False),
    (["--pci", "01:00.0", "-h"], False),
    (["--version"], False),
    (["report", "x.raw"], False),
    (["diff", "a", "b"], False),
    (["status"], False),
    (["record", "--help"], False),
])
def test_which_runs_fetch_the_programs_early(argv, want, monkeypatch) -> None:
    monkeypatch.setattr(start.os, "geteuid", lambda: 0)
    assert start.wants_programs(argv) is want


def test_not_as_root(monkeypatch) -> None:
    monkeypatch.setattr(start.os, "geteuid", lambda: 1000)
    assert not start.wants_programs(["--pci", "01:00.0"])


def test_a_run_that_fails_early_exits_at_once_while_the_programs_compile(tmp_path) -> None:
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(
        "import sys, time\n"
        "from mmiotrace_ng import loader, start\n"
        "def slow(source, programs, cache_dir, on_compile):\n"
        "    on_compile()          # bcc's compiler from here on\n"
        "    time.sleep(60)\n"
        "loader._compiled = slow\n"
        "start.os.geteuid = lambda: 0\n"
        "sys.argv = ['mmiotrace-ng', '--pci', 'zz:zz.z']\n"
        "sys.exit(start.main())\n")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=50, cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("mmiotrace-ng: ") and len(res.stderr.splitlines()) == 1
    assert time.monotonic() - t0 < 20
