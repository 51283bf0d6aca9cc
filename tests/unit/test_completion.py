"""`mmiotrace-ng completion`: the bash script completes what the parsers
define; run in bash here as bash's completion would run it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mmiotrace_ng import cli, completion


def complete(tmp_path, *words: str) -> list[str]:
    """What bash's completion offers for the command line words (the last
    is the word being completed), in tmp_path as the working directory."""
    script = tmp_path / "comp.sh"
    script.write_text(completion.script(cli.build_parser(),
                                        [n for n, c in cli.SUBCOMMANDS.items() if c.listed]))
    quoted = " ".join(f"'{w}'" for w in ("mmiotrace-ng", *words))
    res = subprocess.run(["bash", "-c", f"source {script}; COMP_WORDS=({quoted}); "
                          f"COMP_CWORD={len(words)}; _mmiotrace_ng; "
                          "printf '%s\\n' \"${COMPREPLY[@]}\""],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    return sorted(w for w in res.stdout.splitlines() if w)


@pytest.fixture(autouse=True)
def bash():
    if shutil.which("bash") is None:
        pytest.fail("bash is needed")


def test_commands_and_the_traces_options(tmp_path):
    assert complete(tmp_path, "di") == ["diff"]
    # render is not listed
    assert complete(tmp_path, "re") == ["record", "recover", "replay", "report"]
    assert complete(tmp_path, "--p") == ["--pc", "--pci", "--pid"]


def test_each_commands_own_options(tmp_path):
    assert complete(tmp_path, "diff", "--ex") == ["--exact-counts"]
    assert complete(tmp_path, "plot", "x.rec", "--no") == ["--no-merge"]
    # every option of every command is offered after it
    for name in cli.SUBCOMMANDS:
        sub = cli.build_parser()._subparsers._group_actions[0].choices[name]
        want = sorted(s for a in sub._actions for s in a.option_strings)
        assert complete(tmp_path, name, "-") == want, name


def test_arguments_pci_addresses_maps_files_and_the_command(tmp_path):
    (tmp_path / "load.rec").write_text("")
    assert complete(tmp_path, "report", "lo") == ["load.rec"]
    assert complete(tmp_path, "diff", "-U", "lo") == ["load.rec"]        # an option's value
    assert complete(tmp_path, "annotate", "--regs", "e1") == ["e1000"]
    pci = Path("/sys/bus/pci/devices")
    assert complete(tmp_path, "--pci", "") == sorted(p.name for p in pci.glob("*"))
    assert "mmiotrace-ng" not in complete(tmp_path, "--pci", "01:00.0", "--", "ls")
    assert "ls" in complete(tmp_path, "--pci", "01:00.0", "--", "ls")


def test_the_command_prints_the_script(capsys):
    assert cli.main(["completion"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# bash completion for mmiotrace-ng") and \
        out.rstrip().endswith("complete -F _mmiotrace_ng mmiotrace-ng")
