"""`mmiotrace-ng completion`: a bash completion script made from the
command line's parsers, so that it names every command and option there is.

    mmiotrace-ng completion > /etc/bash_completion.d/mmiotrace-ng

It completes the commands, each command's options (the trace's before any
command), PCI addresses after --pci (from /sys/bus/pci/devices), the shipped
register maps after --regs, file names elsewhere, and after `--` the command
to run and its arguments as bash would."""

from __future__ import annotations

import argparse

from .analysis.regmap import shipped

PROG = "mmiotrace-ng"
# options whose argument is a PCI address, a register map, or a word to type
PCI_OPTIONS = {"--pci"}
REGS_OPTIONS = {"--regs"}


def _options(ap: argparse.ArgumentParser) -> list[str]:
    return sorted(s for a in ap._actions for s in a.option_strings)


def _takes_value(ap: argparse.ArgumentParser) -> list[str]:
    return sorted(s for a in ap._actions if a.option_strings and a.nargs != 0
                  for s in a.option_strings)


def _words(words: list[str]) -> str:
    return " ".join(words)


def script(ap: argparse.ArgumentParser, listed: list[str]) -> str:
    """The bash script for the parser ap (build_parser()'s) whose listed
    commands are these."""
    subs: dict[str, argparse.ArgumentParser] = {}
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            subs = dict(action.choices)
    cases = []
    for name, sub in sorted(subs.items()):
        cases.append(f"        {name}) opts={_words(_options(sub))!r}; "
                     f"valued={_words(_takes_value(sub))!r} ;;")
    top = [o for o in _options(ap)] + sorted(listed)
    return f"""# bash completion for {PROG} (made by `{PROG} completion`)
_mmiotrace_ng() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local cmd="" i opts valued
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${{COMP_WORDS[i]}} in
            --)
                # the command to run while tracing, and its arguments
                if ((i + 1 == COMP_CWORD)); then
                    COMPREPLY=($(compgen -c -- "$cur"))
                else
                    COMPREPLY=($(compgen -f -- "$cur"))
                fi
                return ;;
            {"|".join(sorted(subs))})
                [[ -z $cmd ]] && cmd=${{COMP_WORDS[i]}} ;;
        esac
    done
    case $cmd in
        "") opts={_words(top)!r}; valued={_words(_takes_value(ap))!r} ;;
{chr(10).join(cases)}
    esac
    case $prev in
        {"|".join(sorted(PCI_OPTIONS))})
            COMPREPLY=($(compgen -W "$(ls /sys/bus/pci/devices 2>/dev/null)" -- "$cur"))
            return ;;
        {"|".join(sorted(REGS_OPTIONS))})
            COMPREPLY=($(compgen -W {_words(shipped())!r} -- "$cur")
                       $(compgen -f -- "$cur"))
            return ;;
    esac
    if [[ " $valued " == *" $prev "* ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    elif [[ $cur == -* || ( -z $cmd && $prev != -* ) ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        [[ -z $cmd && $cur != -* ]] || return 0
        [[ ${{#COMPREPLY[@]}} -gt 0 ]] || COMPREPLY=($(compgen -f -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -F _mmiotrace_ng {PROG}
"""


def setup(ap: argparse.ArgumentParser) -> None:
    ap.epilog = ("example:\n  mmiotrace-ng completion > /etc/bash_completion.d/mmiotrace-ng\n"
                 "  (or: source <(mmiotrace-ng completion) in ~/.bashrc)")
    ap.formatter_class = argparse.RawDescriptionHelpFormatter


def run(args: argparse.Namespace) -> int:
    from . import cli

    print(script(cli.build_parser(), [n for n, c in cli.SUBCOMMANDS.items() if c.listed]),
          end="")
    return 0
