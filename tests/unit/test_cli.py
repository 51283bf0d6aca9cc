"""CLI pieces that need no kernel: the command line, raw files, vmallocinfo parsing."""
# ruff: noqa: E501  (vmallocinfo lines are long)

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mmiotrace_ng import arguments, cli
from mmiotrace_ng.format import rawfile
from mmiotrace_ng.format.records import NgRecMark, NgRecType
from mmiotrace_ng.format.render import Renderer
from mmiotrace_ng.tracer import vmalloc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from render_bench import synthetic_access_records  # noqa: E402

VMALLOCINFO = """\
0xffffc90000000000-0xffffc90000002000    8192 acpi_os_map_iomem+0x1c6/0x1f0 phys=0x00000000fed00000 ioremap
0xffffc90000600000-0xffffc90000701000 1052672 pci_iomap_range+0x5e/0x80 phys=0x00000000fea00000 ioremap
0xffffc90000800000-0xffffc90000802000    8192 alloc_thread_stack_node+0x44/0x1b0 pages=1 vmalloc N0=1
0xffffc90000a00000-0xffffc90000b01000 1052672 ng_filter_add+0x9d/0x160 [mmiotng] phys=0x00000000fea00000 ioremap
"""


def test_existing_mappings_picks_the_traced_ranges():
    found = vmalloc.existing_mappings([(0xFEA00000, 0xFEB00000)], VMALLOCINFO)
    assert found == [vmalloc.Existing(0xFFFFC90000600000, 0x100000, 0xFEA00000)]
    assert vmalloc.existing_mappings([(0x1000, 0x2000)], VMALLOCINFO) == []


def test_raw_file_round_trip(tmp_path):
    recs = synthetic_access_records(100)
    path = tmp_path / "t.raw"
    w = rawfile.RawWriter(str(path))
    w.header("VERSION 20070824\n")
    w.records(recs[:60])
    w.records(recs[60:])
    w.close()
    header, back = rawfile.read_raw(str(path))
    assert header == "VERSION 20070824\n" and back == recs
    assert Renderer().feed_batch(back) == Renderer().feed_batch(recs)


def test_raw_file_rejects_other_files(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("VERSION 20070824\n")
    with pytest.raises(rawfile.NotRawFile):
        rawfile.read_raw(str(path))


@pytest.mark.parametrize("argv,words", [
    ([], "nothing to trace"),
    (["--pci", "01:00.0", "modprobe"], "put the command after --"),
    (["--pci", "01:00.0", "--buffer-size-kb", "1"], "at least 4"),
    (["--pci", "01:00.0", "--user", "app", "--no-user"], "not both"),
    (["--pci", "01:00.0", "--user", "a-name-of-16-byt"], "a name of at most 15 bytes"),
    (["--pci", "01:00.0", "--user", ""], "a name of at most 15 bytes"),
    (["--pci", "01:00.0", "--user", "0"], "a process id"),
    (["--pci", "01:00.0", "--user", "4194304999"], "--user 4194304999: no such process"),
    (["--pci", "01:00.0", *[a for n in range(9) for a in ("--user", f"app{n}")]],
     "at most 16 process ids and 8 names"),
])
def test_usage_errors_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        arguments.parse_args(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_user_takes_process_ids_and_names():
    args = arguments.parse_args(["--pci", "01:00.0", "--user", str(os.getpid()), "--user",
                                 "a-name-of-15byt", "--user", "1"])
    assert (args.user_pids, args.user_names) == ([os.getpid(), 1], ["a-name-of-15byt"])
    assert arguments.parse_record(["-o", "x.ngrec", "--pci", "01:00.0", "--user", "1"]).user == [
        "1"]


def test_command_after_double_dash():
    args = arguments.parse_args(["--pci", "01:00.0", "--", "modprobe", "-v", "nouveau"])
    assert args.cmd == ["modprobe", "-v", "nouveau"] and args.pci == ["01:00.0"]


def test_version(capsys) -> None:
    from mmiotrace_ng import __version__
    from mmiotrace_ng.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"mmiotrace-ng {__version__}\n"


def test_existing_mappings_with_hidden_addresses() -> None:
    """kptr_restrict=2: vmallocinfo shows 0 for every address; such entries
    come back with virt 0, for the caller to say why they are not traced."""
    info = ("0x0000000000000000-0x0000000000000000  1052672 pci_iomap_range+0x5e/0x80 "
            "phys=0x00000000fea00000 ioremap\n")
    found = vmalloc.existing_mappings([(0xFEA00000, 0xFEB00000)], info)
    assert [(m.virt, m.phys) for m in found] == [(0, 0xFEA00000)]


# --- the command line: tracing by default, subcommands by their word ---------

SUBCOMMAND_LINES = {
    "diff": "compare two traces as their MMIO traffic",
    "annotate": "a trace for people: register names, callers",
    "export": "a trace as Chrome trace-event JSON or Parquet tables",
    "query": "SQL over a trace's tables (DuckDB)",
    "plot": "draw registers against time (PNG, matplotlib)",
    "replay": "play a trace back to a device, reads checked",
    "ksym": "watch kernel variables with hardware breakpoints",
    "install-helper": "install the helper module with DKMS",
    "mark": "write TEXT into the running trace as a MARK line",
    "record": "trace into a binary file, report it later",
    "recover": "after a crash: the flight recorder's last accesses",
    "report": "print a recorded trace as the tracer does",
    "check": "whether this machine can trace (what is missing)",
    "completion": "a bash completion script for mmiotrace-ng",
    "status": "print the helper module's counters",
}


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of mmiotrace-ng argv, argparse's exits included."""
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--pci", "01:00.0", "--help"]])
def test_help_lists_the_subcommands(argv, capsys):
    status, out, _ = run_main(argv, capsys)
    assert status == 0
    commands = out.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split(None, 1) for line in commands] == [
        [name, line] for name, line in SUBCOMMAND_LINES.items()]
    assert "\n       mmiotrace-ng COMMAND [-h] [ARGS]\n" in out
    # the trace's options and the examples are still there
    assert "--pci BDF" in out and "--buffer-size-kb KB" in out
    assert "examples:\n  mmiotrace-ng --pci 01:00.0 > dump.txt" in out
    assert "--pci 01:00.0 -- modprobe nouveau" in out
    assert 'mmiotrace-ng mark "X is up"' in out


@pytest.mark.parametrize("name,words", [
    ("mark", ["usage: mmiotrace-ng mark [-h] [--] TEXT...", "trace_marker", "joined by spaces"]),
    ("render", ["usage: mmiotrace-ng render [-h] [-o OUT] [--compat] [--pc] [--pid] [--irq]"
                "\n                           [--dma]\n                           FILE",
                "--compat", "--pid", "--irq", "--dma", "record (or --raw)"]),
    ("record", ["usage: mmiotrace-ng record [-h] [--pci BDF[@BARS]] [--all]",
                "--output FILE", "the drain is a copy"]),
    ("status", ["usage: mmiotrace-ng status [-h]", "counters"]),
])
def test_each_subcommand_has_its_help(name, words, capsys):
    status, out, err = run_main([name, "--help"], capsys)
    assert (status, err) == (0, "")
    assert out.startswith(words[0] + "\n")
    assert all(w in out for w in words[1:])
    assert "--histogram" not in out    # not the trace's help


def test_the_trace_parses_the_same_options():
    args = arguments.parse_args([
        "--pci", "01:00.0", "--pci", "0000:03:00.0", "--all", "-o", "out.txt", "--compat",
        "--pc", "--pid", "--buffer-size-kb", "64", "--no-existing", "--no-user",
        "--singlestep", "--raw", "out.raw", "--helper", "mmiotng.ko", "-v", "--",
        "modprobe", "e1000"])
    assert vars(args) == {"verbose": True,
        "pci": ["01:00.0", "0000:03:00.0"], "all": True, "output": "out.txt",
        "compat": True, "pc": True, "pid": True, "buffer_size_kb": 64,
        "no_existing": True, "no_user": True, "user": [], "user_pids": [], "user_names": [], "singlestep": True, "raw": "out.raw",
        "helper": "mmiotng.ko", "cmd": ["modprobe", "e1000"],
        "histogram": False, "interval": None, "irq": False, "dma": False,
        "flight": None, "flight_region": None, "sync": False}
    assert vars(arguments.parse_args(["--all"])) == {
        "verbose": False, "pci": [], "all": True, "output": None, "compat": False, "pc": False,
        "pid": False, "buffer_size_kb": 16384, "no_existing": False, "no_user": False, "user": [], "user_pids": [], "user_names": [], "singlestep": False,
        "raw": None, "helper": None, "cmd": [], "histogram": False, "interval": None,
        "irq": False, "dma": False, "flight": None, "flight_region": None, "sync": False}
    assert vars(arguments.parse_args(["--pci", "1:0.0", "--histogram", "-i", "2"])) == {
        "verbose": False, "pci": ["1:0.0"], "all": False, "output": None, "compat": False, "pc": False,
        "pid": False, "buffer_size_kb": 16384, "no_existing": False, "no_user": False, "user": [], "user_pids": [], "user_names": [], "singlestep": False,
        "raw": None, "helper": None, "cmd": [], "histogram": True, "interval": 2.0,
        "irq": False, "dma": False, "flight": None, "flight_region": None, "sync": False}
    # --flight alone keeps 4096 per CPU; N and the region as given
    assert arguments.parse_args(["--pci", "1:0.0", "--flight"]).flight == 4096
    args = arguments.parse_args(["--pci", "1:0.0", "--flight", "64", "--flight-region",
                                 "2M@0x60000000", "--", "true"])
    assert (args.flight, args.flight_region, args.cmd) == (64, "2M@0x60000000", ["true"])


@pytest.mark.parametrize("argv,message", [
    (["--pci", "1:0.0", "--flight", "0"], "--flight N: N records per CPU"),
    (["--pci", "1:0.0", "--flight-region", "2M@0x6000000"], "--flight-region needs --flight"),
])
def test_flight_option_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        arguments.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--pci", "1:0.0", "-i", "1"], "-i SECONDS needs --histogram"),
    (["--pci", "1:0.0", "--histogram", "-i", "0"], "-i SECONDS needs --histogram"),
    (["--pci", "1:0.0", "--histogram", "--raw", "x"], "no --raw, --compat, --irq or --dma"),
    (["--pci", "1:0.0", "--histogram", "--irq"], "no --raw, --compat, --irq or --dma"),
    (["--pci", "1:0.0", "--histogram", "--dma"], "no --raw, --compat, --irq or --dma"),
    (["--pci", "1:0.0", "--histogram", "--sync"], "no --sync with it"),
])
def test_histogram_option_errors(argv, message, capsys):
    status, _out, err = run_main(argv, capsys)
    assert status == 2 and message in err


@pytest.mark.parametrize("argv,message", [
    # a subcommand's word after the trace's options is a stray argument
    (["--pci", "01:00.0", "mark", "x"], "unexpected argument 'mark' (put the command after --)"),
    ([], "nothing to trace: give --pci BDF (or --all)"),
    (["--pci"], "argument --pci: expected one argument"),
])
def test_other_words_are_the_trace_parser_errors(argv, message, capsys):
    status, out, err = run_main(argv, capsys)
    assert (status, out) == (2, "")
    assert err == f"mmiotrace-ng: {message} (see mmiotrace-ng --help)\n"


def test_mark_joins_the_words(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "TRACING", tmp_path)
    marker = tmp_path / "trace_marker"
    assert run_main(["mark", "X", "is", "up"], capsys) == (0, "", "")
    assert marker.read_text() == "X is up\n"
    # words that look like options are text after the first word, or after --
    assert run_main(["mark", "phase", "-x", "--help"], capsys)[0] == 0
    assert marker.read_text() == "phase -x --help\n"
    assert run_main(["mark", "--", "-x", "--", "y"], capsys)[0] == 0
    assert marker.read_text() == "-x -- y\n"
    assert run_main(["mark", "done\n"], capsys)[0] == 0
    assert marker.read_text() == "done\n"


def test_mark_needs_text(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "TRACING", tmp_path)
    for argv in (["mark"], ["mark", "--"]):
        status, _, err = run_main(argv, capsys)
        assert (status, err) == (2, "mmiotrace-ng: the following arguments are required: "
                                    "TEXT (see mmiotrace-ng mark --help)\n")
    assert not (tmp_path / "trace_marker").exists()


def test_mark_without_tracefs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "TRACING", tmp_path / "none")
    status, _, err = run_main(["mark", "x"], capsys)
    assert status == 2 and err.startswith("mmiotrace-ng: cannot write trace_marker:")


def write_raw(path, recs) -> None:
    w = rawfile.RawWriter(str(path))
    w.header("VERSION 20070824\n")
    w.records(recs)
    w.end(0, 0, None, None)
    w.close()


def test_render_prints_a_raw_file(tmp_path, capsys):
    recs = synthetic_access_records(50)
    path = tmp_path / "t.raw"
    write_raw(path, recs)
    for opts in ([], ["--compat", "--pc", "--pid"]):
        status, out, err = run_main(["render", *opts, str(path)], capsys)
        want = Renderer(compat=bool(opts), show_pc=bool(opts), show_pid=bool(opts))
        assert (status, err) == (0, "")
        assert out == "VERSION 20070824\n" + want.feed_batch(recs)


@pytest.mark.parametrize("argv,words", [
    (["render"], "mmiotrace-ng: the following arguments are required: FILE "
                 "(see mmiotrace-ng render --help)\n"),
    (["render", "/nonexistent/t.raw"], "mmiotrace-ng: cannot read /nonexistent/t.raw"),
    (["render", "-", "extra"], "mmiotrace-ng: unrecognized arguments: extra "
                               "(see mmiotrace-ng render --help)\n"),
    (["status", "--bogus"], "mmiotrace-ng: unrecognized arguments: --bogus "
                            "(see mmiotrace-ng status --help)\n"),
])
def test_subcommand_usage_errors_exit_2(argv, words, capsys):
    status, _, err = run_main(argv, capsys)
    assert status == 2 and words in err


def test_render_of_another_file_exits_2(tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_text("VERSION 20070824\n")
    status, _, err = run_main(["render", str(path)], capsys)
    assert status == 2 and err == f"mmiotrace-ng: {path} is not a trace recorded by mmiotrace-ng\n"


def test_subcommands_are_subparsers():
    """Each subcommand is in the parser's table: one entry adds one."""
    ap = cli.build_parser()
    (sub,) = [a for a in ap._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == list(cli.SUBCOMMANDS)
    assert [c for c in sub.choices if c != "render"] == list(SUBCOMMAND_LINES)
    assert sub.choices["render"].prog == "mmiotrace-ng render"


def test_render_writes_the_bytes_of_marks(tmp_path, capsysbinary):
    """A marker that is not UTF-8 comes out byte for byte, as the tracer
    writes it, whatever the encoding of stdout."""
    text = b"caf\xe9 \xff\n"
    mark = NgRecMark(len=len(text))
    mark.hdr.type, mark.hdr.ts_ns = NgRecType.NG_REC_MARK, 1000
    ctypes.memmove(ctypes.addressof(mark) + NgRecMark.text.offset, text, len(text))
    write_raw(tmp_path / "t.raw", [bytes(mark)[:NgRecMark.text.offset + len(text)]])
    assert cli.main(["render", str(tmp_path / "t.raw")]) == 0
    assert capsysbinary.readouterr().out == b"VERSION 20070824\nMARK 0.000001 " + text


def test_render_into_a_closed_pipe_ends_quietly(tmp_path):
    write_raw(tmp_path / "t.raw", synthetic_access_records(20000))   # > a pipe's buffer
    child = subprocess.Popen([sys.executable, "-m", "mmiotrace_ng", "render",
                              str(tmp_path / "t.raw")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
    child.stdout.close()
    assert child.wait(timeout=60) == 128 + signal.SIGPIPE
    assert child.stderr.read() == b""


def test_status_prints_every_counter(monkeypatch, capsys):
    """`mmiotrace-ng status` prints the helper's counters, one per line."""
    from mmiotrace_ng.tracer import netlink

    st = netlink.Status(*range(1, len(netlink.Status._fields) + 1))

    class Helper:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def status(self):
            return st

    monkeypatch.setattr(netlink, "HelperSocket", Helper)
    status, out, err = run_main(["status"], capsys)
    assert (status, err) == (0, "")
    assert out.splitlines() == [f"{k}: {i}" for i, k in enumerate(netlink.Status._fields, 1)]
