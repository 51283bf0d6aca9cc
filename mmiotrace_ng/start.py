"""The command's entry point.  Before the rest of the tool is imported (a
second of a TCG guest's start), it begins getting the BPF programs (a
compile on the first start for a kernel, seconds there) in a thread, when
the arguments ask to trace; cli.main then does the rest beside it (bcc's
compiler runs without the GIL)."""

from __future__ import annotations

import os
import sys

NOT_TRACING = {"-h", "--help", "--version"}


def wants_programs(argv: list[str]) -> bool:
    """Whether argv is a trace (options first) or `record` run by root, as
    far as can be told without the parser: a wrong guess only starts the
    early fetch for nothing, or leaves it to the trace."""
    if os.geteuid() != 0:
        return False
    words = argv[:argv.index("--")] if "--" in argv else argv
    if not words or NOT_TRACING & set(words):
        return False
    return words[0].startswith("-") or words[0] == "record"


def main() -> int:
    early = wants_programs(sys.argv[1:])
    if early:
        from .loader import LoaderError, prefetch, source_dir

        try:
            prefetch(source_dir("bpf") / "mmiotrace_ng.bpf.c")
        except LoaderError:
            pass        # the trace says what is missing, in its place
    from .cli import main as cli_main

    status = cli_main()
    if early:
        from .loader import prefetch_running

        if prefetch_running():
            # The run ended before it needed the programs (bad input, say)
            # while bcc still compiles them: exit now, without the exit
            # handlers, which would tear LLVM down under the compile.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except OSError:
                    pass
            os._exit(status)
    return status
