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
