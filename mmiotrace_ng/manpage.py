"""Manual pages from the command line's parsers: mmiotrace-ng(1) and one
mmiotrace-ng-COMMAND(1) per subcommand, in roff (man(7) macros).

    python3 -m mmiotrace_ng.manpage [DIR]     # writes DIR/*.1 (default docs/man)

The pages are made from the argparse definitions in cli.py and the modules
of the subcommands, and laid out here rather than by argparse's help
formatter, so that they are the same whatever the terminal width and the
Python version (argparse's layout changed in 3.13).  The wheel installs
them under share/man/man1 (pyproject.toml); tests/unit/test_manpages.py
fails when the committed ones differ from what this module makes."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from . import __version__, cli

SECTION = "1"
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "docs" / "man"
# A paragraph of an epilog that is one of these words alone on its first
# line becomes a section of its own.
_HEADINGS = {"examples:": "EXAMPLES", "exit status:": '"EXIT STATUS"'}


def _escape(text: str) -> str:
    """Text as roff reads it: backslashes and hyphen-minus escaped, a line
    that starts with a control character made text."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line
                     for line in text.split("\n"))


def _bold(text: str) -> str:
    return f"\\fB{_escape(text)}\\fR"


def _italic(text: str) -> str:
    return f"\\fI{_escape(text)}\\fR"


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.option_strings:
        return action.dest.upper()
    return action.dest


def _argument(action: argparse.Action) -> str:
    """What follows an option, or a positional argument, by its nargs."""
    mv = _italic(_metavar(action))
    nargs = action.nargs
    if nargs == 0:
        return ""
    if nargs is None:
        return mv
    if nargs == argparse.OPTIONAL:
        return f"[{mv}]"
    if nargs == argparse.ZERO_OR_MORE:
        return f"[{mv} ...]"
    if nargs == argparse.ONE_OR_MORE:
        return f"{mv} [{mv} ...]"
    if nargs == argparse.REMAINDER:
        return "[\\-\\- " + _italic("CMD ARGS") + "]" if action.dest == "cmd" else f"{mv}..."
    if isinstance(nargs, int):
        return " ".join([mv] * nargs)
    return mv


def _visible(ap: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in ap._actions
            if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]


def _expand(action: argparse.Action, prog: str) -> str:
    """The action's help with its %(...)s filled in, as argparse does."""
    if not action.help:
        return ""
    params = dict(vars(action), prog=prog)
    for name in list(params):
        if params[name] is argparse.SUPPRESS:
            del params[name]
        elif hasattr(params[name], "__name__"):
            params[name] = params[name].__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return action.help % params


def _synopsis(ap: argparse.ArgumentParser, prog: str) -> list[str]:
    """SYNOPSIS: the parser's own usage where it sets one, else one built
    from its arguments (.SY/.YS: the words hang after the command's name)."""
    if ap.usage:
        usage = ap.usage % {"prog": prog}
        return [f'.SY "{_escape(prog)}"', _escape(usage.removeprefix(prog).strip()), ".YS"]
    words = []
    positionals = []
    for a in _visible(ap):
        if not a.option_strings:
            positionals.append(_argument(a))
            continue
        opt = _bold(a.option_strings[0])
        arg = _argument(a)
        word = f"{opt} {arg}" if arg else opt
        words.append(word if a.required else f"[{word}]")
    return [f'.SY "{_escape(prog)}"', *words, *positionals, ".YS"]


def _paragraphs(text: str) -> list[str]:
    """Prose as filled paragraphs; a paragraph with indented lines (examples,
    tables) as it is."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip("\n")):
        lines = para.split("\n")
        if any(line.startswith(" ") for line in lines):
            out += [".PP", ".nf", _escape(para.rstrip()), ".fi"]
        else:
            out += [".PP", _escape(" ".join(line.strip() for line in lines))]
    return out


def _epilog(text: str) -> list[str]:
    """An epilog: its paragraphs, "examples:" and "Exit status:" as sections."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip("\n")):
        first, _, rest = para.partition("\n")
        if first.strip() in _HEADINGS:
            out += [f".SH {_HEADINGS[first.strip()]}", ".nf",
                    _escape("\n".join(line[2:] if line.startswith("  ") else line
                                      for line in rest.split("\n")).rstrip()), ".fi"]
        elif para.startswith("Exit status:"):
            text = para.removeprefix("Exit status:").strip()
            out += [".SH \"EXIT STATUS\"", *_paragraphs(text[:1].upper() + text[1:])[1:]]
        else:
            out += _paragraphs(para)
    return out


def _options(ap: argparse.ArgumentParser, prog: str) -> list[str]:
    out: list[str] = []
    positionals = [a for a in _visible(ap) if not a.option_strings]
    optionals = [a for a in _visible(ap) if a.option_strings]
    for title, actions in (("ARGUMENTS", positionals), ("OPTIONS", optionals)):
        if not actions:
            continue
        out.append(f".SH {title}")
        for a in actions:
            arg = _argument(a)
            if a.option_strings:
                tag = ", ".join(_bold(s) for s in a.option_strings)
                tag = f"{tag} {arg}" if arg else tag
            else:
                tag = arg
            out += [".TP", tag, _escape(_expand(a, prog)) or "\\&"]
    return out


def _header(name: str, summary: str) -> list[str]:
    return [f'.TH {name.upper()} {SECTION} "" "mmiotrace-ng {__version__}" "User Commands"',
            ".SH NAME", f"{_escape(name)} \\- {_escape(summary)}"]


def _page(ap: argparse.ArgumentParser, name: str, prog: str, summary: str,
          extra: list[str], see_also: list[str]) -> str:
    lines = [f".\\\" Made by {__package__}.manpage from the parsers; do not edit.",
             *_header(name, summary), ".SH SYNOPSIS", *_synopsis(ap, prog)]
    if ap.description:
        lines += [".SH DESCRIPTION", *_paragraphs(ap.description)]
    lines += _options(ap, prog)
    lines += extra
    if ap.epilog:
        lines += _epilog(ap.epilog)
    lines += [".SH \"SEE ALSO\"",
              ",\n".join(f".BR \\%{_escape(p)} ({SECTION})" for p in see_also)]
    return "\n".join(lines) + "\n"


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    raise LookupError("the parser has no subcommands")


def pages() -> dict[str, str]:
    """File name -> roff text, for mmiotrace-ng.1 and each subcommand's page."""
    subs = _subparsers(cli.build_parser())
    names = [f"{cli.PROG}-{n}" for n in sorted(subs)]
    commands = [".SH COMMANDS",
                "Without a command word, " + _bold(cli.PROG) + " traces, with the options "
                "above.  Each command has its own page and its own " + _bold("--help") + "."]
    for n in sorted(n for n in subs if cli.SUBCOMMANDS[n].listed):
        commands += [".TP", _bold(n), _escape(cli.SUBCOMMANDS[n].summary) + "; see",
                     f".BR \\%{_escape(cli.PROG + '-' + n)} ({SECTION})."]
    page = _page(cli.trace_parser(), cli.PROG, cli.PROG,
                 "trace the MMIO accesses of PCI devices", commands, names)
    # the second form of the command line: a command word
    other = [f'.SY "{_escape(cli.PROG)}"', _italic("COMMAND"), "[" + _bold("-h") + "]",
             "[" + _italic("ARGS") + "]", ".YS"]
    out = {f"{cli.PROG}.{SECTION}": page.replace(".YS\n", ".YS\n" + "\n".join(other) + "\n", 1)}
    for n, ap in sorted(subs.items()):
        name = f"{cli.PROG}-{n}"
        out[f"{name}.{SECTION}"] = _page(ap, name, f"{cli.PROG} {n}",
                                         cli.SUBCOMMANDS[n].summary, [],
                                         [cli.PROG] + [p for p in names if p != name])
    return out


def write(directory: Path) -> list[Path]:
    """Write the pages into directory (made if need be); remove pages of
    commands that no longer exist.  Returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    made = pages()
    for old in directory.glob(f"{cli.PROG}*.{SECTION}"):
        if old.name not in made:
            old.unlink()
    written = []
    for fname, text in made.items():
        path = directory / fname
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m mmiotrace_ng.manpage",
                                 description="Write the manual pages made from the parsers.")
    ap.add_argument("directory", nargs="?", type=Path, default=DEFAULT_DIR,
                    help="where to write them (default: docs/man of the checkout)")
    args = ap.parse_args(argv)
    for path in write(args.directory):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
