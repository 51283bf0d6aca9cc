"""The manual pages in docs/man are those the parsers give: an option added,
removed or reworded in cli.py (or a subcommand's module) and not in the
pages fails here until they are made again."""

from __future__ import annotations

import argparse
import shutil
import subprocess

from ng_require import missing

from mmiotrace_ng import cli, manpage

REGENERATE = "python3 -m mmiotrace_ng.manpage"
COMMITTED = manpage.DEFAULT_DIR


def test_committed_pages_are_the_parsers_pages():
    made = manpage.pages()
    committed = {p.name: p.read_text(encoding="utf-8")
                 for p in COMMITTED.glob(f"{cli.PROG}*.{manpage.SECTION}")}
    hint = f"docs/man differs from the parsers: run `{REGENERATE}` in the checkout and commit"
    assert sorted(committed) == sorted(made), hint
    stale = [name for name in made if committed[name] != made[name]]
    assert not stale, f"{hint} ({', '.join(stale)})"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    subs = manpage._subparsers(cli.build_parser())
    return {f"{cli.PROG}.1": cli.trace_parser(),
            **{f"{cli.PROG}-{n}.1": ap for n, ap in subs.items()}}


def test_a_page_per_command_with_every_option():
    pages = manpage.pages()
    assert set(pages) == set(_parsers())
    for name, ap in _parsers().items():
        text = pages[name]
        for action in ap._actions:
            for opt in action.option_strings:
                assert f"\\fB{opt.replace('-', chr(92) + '-')}\\fR" in text, (name, opt)
    for sub in cli.SUBCOMMANDS:
        ref = f"{cli.PROG}-{sub}".replace("-", "\\-")
        assert f".BR \\%{ref} (1)" in pages[f"{cli.PROG}.1"], sub


def test_regenerating_writes_the_same_files(tmp_path):
    (tmp_path / f"{cli.PROG}-gone.1").write_text("a command that no longer exists")
    manpage.main([str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(manpage.pages())


def test_pages_format_without_warnings():
    if not shutil.which("groff"):
        missing("no groff to format the pages (Debian: groff-base)")
    for page in sorted(COMMITTED.glob("*.1")):
        res = subprocess.run(["groff", "-man", "-ww", "-z", "-Tutf8", str(page)],
                             capture_output=True, text=True, check=False)
        assert res.returncode == 0 and not res.stderr, (page.name, res.stderr)
