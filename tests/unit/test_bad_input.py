"""Every command that reads a trace says the same of input it cannot use:
exit status 2, one line on stderr, nothing on stdout, no output file; and
each reads standard input (-) as it reads a file.  Also the command line's
own mistakes: an unknown command."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from mmiotrace_ng import cli
from mmiotrace_ng.format import rawfile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from render_bench import synthetic_access_records  # noqa: E402
from test_cli import run_main  # noqa: E402

NOT_A_TRACE = "is not a trace: neither mmiotrace text (20070824) nor a recording of mmiotrace-ng"
BAD = {     # name: (content, what the message says after the name)
    "garbage.txt": (b"hello world\nfoo bar\n", f"{NOT_A_TRACE} (it starts 'hello world')"),
    "garbage.bin": (bytes(range(256)) * 12, f"{NOT_A_TRACE} (binary data)"),
    "noline.bin": (b"\xe9\x15S\x97" * 1000, f"{NOT_A_TRACE} (binary data)"),
    "empty.txt": (b"", "is empty: no trace in it"),
    "blank.txt": (b"\n\n# nothing\n", "is empty: no trace in it"),
}
# each reader's command line for the input FILE (OUT: its output file, if any)
READERS = {
    "annotate": ["annotate", "FILE"],
    "export": ["export", "--chrome", "OUT", "FILE"],
    "export parquet": ["export", "--parquet", "OUT", "FILE"],
    "query": ["query", "FILE"],
    "plot": ["plot", "FILE", "-o", "OUT"],
    "report": ["report", "FILE"],
    "render": ["render", "FILE"],
    "diff": ["diff", "FILE", "GOOD"],
    "diff B": ["diff", "GOOD", "FILE"],
    "replay": ["replay", "--pci", "00:1f.7", "-o", "OUT", "FILE"],
}



def command(reader: str, path: str, tmp_path: Path) -> list[str]:
    good = tmp_path / "good.txt"
    good.write_text("VERSION 20070824\nR 4 1.000000 1 0x1000 0x1 0x0 0\n")
    subst = {"FILE": path, "OUT": str(tmp_path / "out"), "GOOD": str(good)}
    return [subst.get(w, w) for w in READERS[reader]]


@pytest.fixture(autouse=True)
def _matplotlib():
    pytest.importorskip("matplotlib")   # plot checks its input before; the rest needs none


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("name", BAD)
def test_a_file_that_is_no_trace(reader, name, tmp_path, capsys):
    content, said = BAD[name]
    path = tmp_path / name
    path.write_bytes(content)
    assert run_main(command(reader, str(path), tmp_path), capsys) == (
        2, "", f"mmiotrace-ng: {path} {said}\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("name", BAD)
def test_standard_input_that_is_no_trace(reader, name, tmp_path, monkeypatch, capsys):
    content, said = BAD[name]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(content)))
    assert run_main(command(reader, "-", tmp_path), capsys) == (
        2, "", f"mmiotrace-ng: standard input {said}\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("reader", READERS)
def test_unreadable_files(reader, tmp_path, capsys):
    missing = tmp_path / "none"
    assert run_main(command(reader, str(missing), tmp_path), capsys) == (
        2, "", f"mmiotrace-ng: cannot read {missing}: No such file or directory\n")
    assert run_main(command(reader, str(tmp_path), tmp_path), capsys) == (
        2, "", f"mmiotrace-ng: cannot read {tmp_path}: Is a directory\n")


@pytest.mark.parametrize("reader", ["query", "export parquet"])
def test_unreadable_files_where_the_sql_packages_are_missing(reader, tmp_path, capsys,
                                                             monkeypatch):
    """A release without pyarrow (trixie): a file that cannot be read is
    said as everywhere, not a traceback of the missing import."""
    for name in ("pyarrow", "pyarrow.parquet", "duckdb", "numpy"):
        monkeypatch.setitem(sys.modules, name, None)     # import raises ImportError
    monkeypatch.delitem(sys.modules, "mmiotrace_ng.analysis.table", raising=False)
    test_unreadable_files(reader, tmp_path, capsys)


def test_report_of_a_text_trace(tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_text("VERSION 20070824\n")
    assert run_main(["report", str(path)], capsys) == (
        2, "", f"mmiotrace-ng: {path} is not a trace recorded by mmiotrace-ng\n")


def recording(path: Path) -> Path:
    w = rawfile.RawWriter(str(path))
    w.header("VERSION 20070824\n")
    w.records(synthetic_access_records(300))
    w.end(0, 0, None, None)
    w.close()
    return path


def stdin_of(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


@pytest.mark.parametrize("reader", ["report", "annotate", "export", "plot", "diff"])
def test_standard_input_reads_as_a_file(reader, tmp_path, monkeypatch, capsysbinary):
    """A recording (report, and the others) and its text (the others) on
    standard input give what the file gives."""
    rec = recording(tmp_path / "t.rec")
    argv = {"report": ["report", "X"], "annotate": ["annotate", "X"],
            "export": ["export", "--chrome", "-", "X"], "plot": ["plot", "X", "-o", "-"],
            "diff": ["diff", "X", str(rec)]}[reader]
    sources = [rec.read_bytes()]
    if reader != "report":
        assert cli.main(["report", str(rec), "-o", str(tmp_path / "t.txt")]) == 0
        sources.append((tmp_path / "t.txt").read_bytes())
    for data in sources:
        path = tmp_path / "in"
        path.write_bytes(data)
        from_file = cli.main([str(path) if w == "X" else w for w in argv])
        want = capsysbinary.readouterr()
        stdin_of(monkeypatch, data)
        assert cli.main(["-" if w == "X" else w for w in argv]) == from_file == 0
        got = capsysbinary.readouterr()
        if reader == "export":      # its source is named in otherData
            got = got._replace(out=got.out.replace(b'"source":"-"', f'"source":"{path}"'.encode()))
        if reader != "plot":        # a PNG has its title, the file's name
            assert got == want and (want.out or reader == "diff")
        else:
            assert got.out.startswith(b"\x89PNG") and got.err == want.err


def test_output_dash_is_standard_output(tmp_path, capsysbinary):
    rec = recording(tmp_path / "t.rec")
    assert cli.main(["report", str(rec)]) == 0
    want = capsysbinary.readouterr().out
    assert cli.main(["report", "-o", "-", str(rec)]) == 0
    assert capsysbinary.readouterr().out == want and not Path("-").exists()


@pytest.mark.parametrize("argv,err", [
    (["reprot", "x"], "unknown command 'reprot': did you mean 'report'? "
                      "(see mmiotrace-ng --help)"),
    (["marks", "x"], "unknown command 'marks': did you mean 'mark'? (see mmiotrace-ng --help)"),
    (["ksyms"], "unknown command 'ksyms': did you mean 'ksym'? (see mmiotrace-ng --help)"),
    (["modprobe", "e1000"], "unknown command 'modprobe' (see mmiotrace-ng --help; a command "
                            "to run while tracing goes after --)"),
])
def test_an_unknown_command(argv, err, capsys):
    assert run_main(argv, capsys) == (2, "", f"mmiotrace-ng: {err}\n")


def test_render_works_but_is_not_listed(tmp_path, capsys):
    status, out, _ = run_main(["--help"], capsys)
    listed = out.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0]
    assert status == 0 and "render" not in listed and "  report " in listed
    rec = recording(tmp_path / "t.rec")
    assert run_main(["render", str(rec)], capsys)[:2] == run_main(["report", str(rec)],
                                                                  capsys)[:2]


def test_help_says_the_exit_statuses(capsys):
    out = run_main(["--help"], capsys)[1]
    assert ("exit status:\n"
            "  0  done (a trace: after Ctrl-C/SIGTERM)\n"
            "  1  diff: the traces differ\n"
            "  2  bad usage or input") in out
    assert "  the command's own status with -- CMD\n" in out
