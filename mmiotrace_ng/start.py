"""The command's entry point.  Before the rest of the tool is imported (a
second of a TCG guest's start), a trace or `record` run by root has its
arguments parsed and checked (arguments.py: argparse and little else), then
begins getting the BPF programs (a compile on the first start for a kernel,
seconds there) in a thread; cli.main then does the rest beside it (bcc's
compiler runs without the GIL).  A usage error ends the run before anything
starts: no compile, no module load."""

from __future__ import annotations

import os
import sys


def wants_programs(argv: list[str]) -> bool:
    """Whether argv would be a trace (options first) or `record` run by
    root: one to parse early, and to fetch the programs for if it parses."""
    if os.geteuid() != 0 or not argv:
        return False
    return argv[0].startswith("-") or argv[0] == "record"


def prefetch_programs() -> None:
    """Begin getting the tracer's BPF programs in the background."""
    from .common.bpfload import LoaderError
    from .tracer.loader import start_compile

    try:
        start_compile()
    except LoaderError:
        pass        # the trace says what is missing, in its place


def main() -> int:
    argv = sys.argv[1:]
    parsed = None
    if wants_programs(argv):
        from .arguments import parse_tracing

        parsed = parse_tracing(argv)    # a usage error exits here, status 2
        prefetch_programs()
    from .cli import main as cli_main

    status = cli_main(argv, parsed)
    if parsed is not None:
        from .common.bpfload import prefetch_running

        if prefetch_running():
            # The run ended before it needed the programs (no such device,
            # say) while bcc still compiles them: exit now, without the exit
            # handlers, which would tear LLVM down under the compile.
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except OSError:
                    pass
            os._exit(status)
    return status
