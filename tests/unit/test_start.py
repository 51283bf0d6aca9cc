"""start: which command lines begin getting the BPF programs early."""

from __future__ import annotations

import argparse
import sys

import pytest

from mmiotrace_ng import arguments, start


@pytest.mark.parametrize("argv,want", [
    (["--pci", "01:00.0"], True),
    (["record", "--pci", "01:00.0", "-o", "x"], True),
    (["--help"], True),                 # parsed early: argparse prints the help
    ([], False),
    (["report", "x.raw"], False),
    (["diff", "a", "b"], False),
    (["status"], False),
])
def test_which_runs_are_parsed_early(argv, want, monkeypatch) -> None:
    monkeypatch.setattr(start.os, "geteuid", lambda: 0)
    assert start.wants_programs(argv) is want


def test_not_as_root(monkeypatch) -> None:
    monkeypatch.setattr(start.os, "geteuid", lambda: 1000)
    assert not start.wants_programs(["--pci", "01:00.0"])


def run_start(argv: list[str], euid: int, monkeypatch, capsys):
    """start.main on argv as user euid, the prefetch and the trace replaced:
    (exit status, stderr, prefetches begun, the arguments the trace got)."""
    from mmiotrace_ng import cli
    from mmiotrace_ng.tracer import session

    prefetches: list[int] = []
    traced: list = []
    monkeypatch.setattr(start.os, "geteuid", lambda: euid)
    monkeypatch.setattr(start, "prefetch_programs", lambda: prefetches.append(1))
    # a trace, and the trace a record run makes
    for module in (cli, session):
        monkeypatch.setattr(module, "trace", lambda args: traced.append(args) or 0)
    monkeypatch.setattr(sys, "argv", ["mmiotrace-ng", *argv])
    try:
        status = start.main()
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err, len(prefetches), traced


TRACE_HELP = " (see mmiotrace-ng --help)\n"
RECORD_HELP = " (see mmiotrace-ng record --help)\n"
BAD_BDF = ("bad PCI address 'zz': expected [DDDD:]BB:DD.F in hex, e.g. 0000:01:00.0 or "
           "01:00.0 (see lspci -D)")


@pytest.mark.parametrize("euid", [0, 1000])
@pytest.mark.parametrize("argv,err", [
    (["--bogus"], "mmiotrace-ng: unrecognized arguments: --bogus" + TRACE_HELP),
    (["--pci", "zz"], f"mmiotrace-ng: {BAD_BDF}" + TRACE_HELP),
    (["--pci", "01:00.0@x"], "mmiotrace-ng: bad BAR list 'x' in '01:00.0@x': BAR numbers "
     "0-5, e.g. 01:00.0@0,2" + TRACE_HELP),
    (["--pci", "01:00.0", "modprobe"], "mmiotrace-ng: unexpected argument 'modprobe' (put "
     "the command after --)" + TRACE_HELP),
    (["record", "--pci", "01:00.0"], "mmiotrace-ng: the following arguments are required: "
     "-o/--output" + RECORD_HELP),
    (["record", "-o", "x.rec"], "mmiotrace-ng: nothing to trace: give --pci BDF (or --all)"
     + RECORD_HELP),
    (["record", "--pci", "zz", "-o", "x.rec"], f"mmiotrace-ng: {BAD_BDF}" + RECORD_HELP),
])
def test_usage_errors_before_anything_starts(argv, err, euid, monkeypatch, capsys) -> None:
    """As root: no compile begun (bcc would run modprobe kheaders); as a
    user: the usage error, not the missing privilege."""
    assert run_start(argv, euid, monkeypatch, capsys) == (2, err, 0, [])


def test_a_good_trace_fetches_the_programs_then_traces(monkeypatch, capsys) -> None:
    status, err, prefetches, traced = run_start(["--pci", "01:00.0", "--", "true"], 0,
                                                monkeypatch, capsys)
    assert (status, err, prefetches) == (0, "", 1)
    assert traced[0].pci == ["01:00.0"] and traced[0].cmd == ["true"]
    status, err, prefetches, traced = run_start(
        ["record", "--pci", "01:00.0@0", "-o", "x.rec", "--", "true"], 0, monkeypatch, capsys)
    assert (status, err, prefetches) == (0, "", 1)
    assert (traced[0].raw, traced[0].output, traced[0].cmd) == ("x.rec", None, ["true"])


def test_as_a_user_a_good_trace_needs_root(monkeypatch, capsys) -> None:
    monkeypatch.setattr(start.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sys, "argv", ["mmiotrace-ng", "--pci", "01:00.0"])
    assert start.main() == 2
    assert capsys.readouterr().err == ("mmiotrace-ng: must be run as root (it loads a kernel "
                                       "module and BPF programs)\n")


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["record", "--help"]])
def test_help_and_version_fetch_nothing(argv, monkeypatch, capsys) -> None:
    status, err, prefetches, traced = run_start(argv, 0, monkeypatch, capsys)
    assert (status, err, prefetches, traced) == (0, "", 0, [])


def test_record_parses_the_same_early_and_late() -> None:
    """The record parser start.py uses is the one of mmiotrace-ng record."""
    from mmiotrace_ng import cli

    (sub,) = [a for a in cli.build_parser()._actions
              if isinstance(a, argparse._SubParsersAction)]
    late = sub.choices["record"]
    assert late.format_help() == arguments.record_parser().format_help()


def test_a_run_that_fails_early_exits_at_once_while_the_programs_compile(tmp_path) -> None:
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(
        "import sys, time\n"
        "from mmiotrace_ng import start\n"
        "from mmiotrace_ng.common import bpfload as loader\n"
        "def slow(source, programs, cache_dir, on_compile):\n"
        "    on_compile()          # bcc's compiler from here on\n"
        "    time.sleep(60)\n"
        "loader._compiled = slow\n"
        "start.os.geteuid = lambda: 0\n"
        "sys.argv = ['mmiotrace-ng', '--pci', 'ffff:ff:1f.7']   # no such device\n"
        "sys.exit(start.main())\n")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=50, cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("mmiotrace-ng: ") and len(res.stderr.splitlines()) == 1
    assert time.monotonic() - t0 < 20
