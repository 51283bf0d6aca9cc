"""mmiotrace-ng's command line: a trace (tracer/session.py) or one of the
commands, each a setup of its arguments and a run (SUBCOMMANDS)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from .arguments import (
    PROG,
    RECORD,
    RECORD_DESCRIPTION,
    RECORD_SUMMARY,
    add_command,
    add_text_options,
    add_trace_options,
    make_parser,
    parse_tracing,
    record_setup,
    trace_parser,
)
from .common.bpfload import LoaderError
from .common.errors import EXIT_USAGE, UsageError
from .common.output import ClosedPipe, closed_pipe, writing
from .common.phases import PHASES
from .format.render import ENCODING, ERRORS, Renderer
from .tracer.session import TRACING, record, trace

if TYPE_CHECKING:   # imported where used: only recordings need them
    pass

class Subcommand(NamedTuple):
    """A word after mmiotrace-ng that does something other than trace.

    summary: its line in mmiotrace-ng --help; description: its own --help's
    text; setup adds its arguments to its parser; run does the work and
    gives the exit status (UsageError: a message and status 2)."""

    name: str
    summary: str
    description: str
    setup: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    takes_command: bool = False      # `-- CMD ARGS` after its arguments
    listed: bool = True              # in mmiotrace-ng --help's list (it works either way)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, as --help shows it: the trace options and the
    subcommands.  It parses the subcommands; a trace is parsed by trace_parser()."""
    trace_usage = trace_parser().format_usage().removeprefix("usage: ").rstrip()
    ap = make_parser(usage=f"{trace_usage}\n       {PROG} COMMAND [-h] [ARGS]")
    add_trace_options(ap)
    sub = ap.add_subparsers(title="commands", metavar="COMMAND", prog=PROG)
    for cmd in SUBCOMMANDS.values():
        # argparse lists the commands with a help (the others work all the same)
        listed = {"help": cmd.summary} if cmd.listed else {}
        p = sub.add_parser(cmd.name, description=cmd.description, **listed)
        cmd.setup(p)
        p.set_defaults(run=cmd.run, subparser=p)
    add_command(ap)
    return ap


# --- subcommands: a setup (its arguments) and a run each, in SUBCOMMANDS --------


def _mark_setup(ap: argparse.ArgumentParser) -> None:
    # the words from the first that is not an option on are text, "-x" too
    ap.add_argument("text", nargs=argparse.REMAINDER, metavar="TEXT",
                    help="what to write; several words are joined by spaces "
                         "(text that starts with - goes after --)")
    ap.usage = "%(prog)s [-h] [--] TEXT..."


def mark(args: argparse.Namespace) -> int:
    words = args.text[1:] if args.text[:1] == ["--"] else args.text
    if not words:
        args.subparser.error("the following arguments are required: TEXT")
    text = " ".join(words)
    try:
        with open(TRACING / "trace_marker", "w") as fh:
            fh.write(text + ("" if text.endswith("\n") else "\n"))
    except OSError as exc:
        raise UsageError(f"cannot write trace_marker: {exc.strerror}") from exc
    return 0


def _report_setup(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("file", metavar="FILE",
                    help="a file written by record (or --raw); - for standard input")
    ap.add_argument("-o", "--output", metavar="OUT",
                    help="write the text here, not stdout (- : stdout)")
    add_text_options(ap)


def report(args: argparse.Namespace) -> int:
    from .analysis.tracefile import Trace, TraceError, rendered_text

    try:
        trace = Trace(args.file)
    except TraceError as exc:
        raise UsageError(str(exc)) from exc
    rec = trace.recording
    if rec is None:
        raise UsageError(f"{trace.name} is not a trace recorded by mmiotrace-ng")
    r = Renderer(compat=args.compat, show_pc=args.pc, show_pid=args.pid, irq=args.irq,
                 dma=args.dma)
    with writing(args.output) as out:
        # the bytes the tracer would have written, whatever stdout's encoding
        for text in rendered_text(rec, r):
            out.write(text.encode(ENCODING, ERRORS))
    if r.bad:
        print(f"mmiotrace-ng: {r.bad} corrupt records skipped", file=sys.stderr)
    if rec.unverified:
        why = " (cut short or overwritten when the tracer was killed?)" if rec.end is None else ""
        print(f"mmiotrace-ng: {trace.name}: {rec.unverified} bytes of records fail their "
              f"checksums and are left out{why}", file=sys.stderr)
    if rec.format == 2 and rec.end is None:
        print(f"mmiotrace-ng: {trace.name} ends without its END section: the recording was "
              "cut short (the tracer killed?)", file=sys.stderr)
    return 0


def _no_arguments(ap: argparse.ArgumentParser) -> None:
    pass


def status(args: argparse.Namespace) -> int:
    from .tracer.netlink import HelperError, HelperSocket

    try:
        with HelperSocket() as h:
            st = h.status()
    except HelperError as exc:
        raise UsageError(str(exc)) from exc
    for k, v in st._asdict().items():
        print(f"{k}: {v}")
    return 0


def _install_helper_setup(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--kernel", metavar="VERSION",
                    help="build for this installed kernel (default: the running one)")


def install_helper(args: argparse.Namespace) -> int:
    from .tracer.kmodload import dkms_install, dkms_version

    if os.geteuid() != 0:
        raise UsageError("must be run as root (it installs a kernel module)")
    release = args.kernel or os.uname().release
    print(f"mmiotrace-ng: building and installing the helper module for {release} with "
          "DKMS ...", file=sys.stderr, flush=True)
    path = dkms_install(release)
    print(f"mmiotrace-ng: mmiotng {dkms_version()} installed for {release} ({path}); DKMS "
          "rebuilds it for each new kernel", file=sys.stderr)
    if release == os.uname().release:
        # the first trace then starts as fast as the later ones (bcc needs
        # the running kernel's headers: other kernels compile on first use)
        from .common.bpfload import compiled, source_dir
        from .ksym.probes import PROGRAMS as KSYM_PROGRAMS
        from .tracer.loader import tracer_object

        tracer_object()
        compiled(source_dir("bpf") / "ksym.bpf.c", KSYM_PROGRAMS)
        print("mmiotrace-ng: the BPF programs are compiled and cached for "
              f"{release}", file=sys.stderr)
    return 0


def _ksym_setup(ap: argparse.ArgumentParser) -> None:
    from .ksym.main import setup

    setup(ap)


def ksym(args: argparse.Namespace) -> int:
    from .ksym.main import run

    return run(args)


def _lazy(module: str) -> tuple[Callable[[argparse.ArgumentParser], None],
                                Callable[[argparse.Namespace], int]]:
    """setup and run of a subcommand whose module (mmiotrace_ng.MODULE, with
    setup(ap) and run(args)) is imported only when it is used."""
    from importlib import import_module

    def setup(ap: argparse.ArgumentParser) -> None:
        import_module(f"mmiotrace_ng.{module}").setup(ap)

    def run(args: argparse.Namespace) -> int:
        return import_module(f"mmiotrace_ng.{module}").run(args)

    return setup, run


SUBCOMMANDS: dict[str, Subcommand] = {c.name: c for c in (
    Subcommand("diff", "compare two traces as their MMIO traffic",
               "Compare two traces (text or recorded) the way their users do: timestamps, "
               "virtual addresses, map ids, instruction addresses and pids ignored, runs of "
               "one repeated record (polling) folded.  Exit status 0: the same, 1: they "
               "differ, 2: trouble.", *_lazy("analysis.diff")),
    Subcommand("annotate", "a trace for people: register names, callers",
               "Print a trace (text or recorded) as a readable listing: register names and "
               "fields from a register map, callers, time deltas, polling loops folded.",
               *_lazy("analysis.annotate")),
    Subcommand("export", "a trace as Chrome trace-event JSON or Parquet tables",
               "Write a trace (text or recorded) in the Chrome trace-event format that "
               "Perfetto's UI and chrome://tracing open, or as Parquet tables that SQL "
               "engines read (DuckDB, Spark, Trino).", *_lazy("analysis.export")),
    Subcommand("query", "SQL over a trace's tables (DuckDB)",
               "Run SQL over a trace (text or recorded, converted on the fly) or over the "
               "Parquet tables export --parquet wrote, with DuckDB embedded: the tables "
               "records, devices and mappings; named queries for the common questions.",
               *_lazy("analysis.query")),
    Subcommand("plot", "draw registers against time (PNG, matplotlib)",
               "Draw the accesses of a trace (text or recorded): register against time, "
               "reads and writes in two colours, MARK lines as labelled verticals.",
               *_lazy("analysis.plot")),
    Subcommand("replay", "play a trace back to a device, reads checked",
               "Play the accesses of a trace (text or recorded) back to a PCI device from "
               "user space, through its sysfs resource files: writes made, reads compared, "
               "polls waited for; or find the write after which a check succeeds "
               "(--bisect).  Exit status 0: every read as recorded, 1: a mismatch, "
               "2: trouble.", *_lazy("replay.command")),

    Subcommand("ksym", "watch kernel variables with hardware breakpoints",
               "", _ksym_setup, ksym, takes_command=True),
    Subcommand("install-helper", "install the helper module with DKMS",
               "Copy the helper module's sources to /usr/src/mmiotng-VERSION, register them "
               "with DKMS and build and install the module for this kernel; tracing then "
               "loads it instead of building one.  For the running kernel it also compiles "
               "the BPF programs into the cache, which a first trace would do.",
               _install_helper_setup, install_helper),
    Subcommand("mark", "write TEXT into the running trace as a MARK line",
               "Write TEXT to the kernel's trace_marker: a running mmiotrace-ng prints it "
               "as a MARK line, in order with the accesses around it.",
               _mark_setup, mark),
    Subcommand(RECORD, RECORD_SUMMARY, RECORD_DESCRIPTION, record_setup, record,
               takes_command=True),
    Subcommand("recover", "after a crash: the flight recorder's last accesses",
               "Print what the flight recorder (a trace with --flight) kept in reserved "
               "memory across a crash and the warm reboot: the last accesses of each CPU as "
               "the tracer's text in time order, MARK lines for the CPU they came from and "
               "why the machine died (panic, oops, lockup, sysrq-c).  Run it after the "
               "reboot: the next --flight trace refuses to overwrite a crash's records "
               "until recover --clear lets them go.",
               *_lazy("tracer.recover")),
    Subcommand("report", "print a recorded trace as the tracer does",
               "Print the trace a file from record (or --raw) holds: the same bytes as a "
               "live run with the same options.",
               _report_setup, report),
    Subcommand("render", "the same as report (its older name)",
               "Print the trace a file from record (or --raw) holds (see report).",
               _report_setup, report, listed=False),
    Subcommand("check", "whether this machine can trace (what is missing)",
               "Check what tracing needs, one line each: the kernel's options, tracefs, BTF, "
               "the kprobes and ftrace switches, the kernel's own mmiotrace, lockdown, "
               "module signatures (Secure Boot), the helper module and the Python modules; "
               "what is missing, with how to fix it.", *_lazy("doctor")),
    Subcommand("completion", "a bash completion script for mmiotrace-ng",
               "Print a bash completion script made from this command line's parsers: "
               "commands, options, PCI addresses after --pci, register maps after --regs.",
               *_lazy("completion")),
    Subcommand("status", "print the helper module's counters",
               "Print the counters of the loaded helper module (mmiotng), one per line.",
               _no_arguments, status),
)}


def unknown_command(word: str) -> str:
    """What to say of a first word that is neither an option nor a command."""
    close = difflib.get_close_matches(word, list(SUBCOMMANDS), n=1)
    if close:
        return f"unknown command {word!r}: did you mean {close[0]!r}? (see {PROG} --help)"
    return (f"unknown command {word!r} (see {PROG} --help; a command to run while tracing "
            "goes after --)")


def main(argv: list[str] | None = None, parsed: argparse.Namespace | None = None) -> int:
    """Run the command line argv; parsed: argv's trace or record, parsed
    already by arguments.parse_tracing (start.py does, before it fetches
    the BPF programs)."""
    PHASES.done("interpreter and imports")
    argv = sys.argv[1:] if argv is None else argv
    try:
        if parsed is None and argv[:1] and not argv[0].startswith("-") \
                and argv[0] not in SUBCOMMANDS:
            raise UsageError(unknown_command(argv[0]))
        if parsed is None and (not argv[:1] or argv[0].startswith("-") or argv[0] == RECORD):
            parsed = parse_tracing(argv)
        if parsed is not None:
            return record(parsed) if parsed.command == RECORD else trace(parsed)
        cmd: list[str] = []
        if SUBCOMMANDS[argv[0]].takes_command and "--" in argv:
            cut = argv.index("--")
            argv, cmd = argv[:cut], argv[cut + 1:]
        args, extra = build_parser().parse_known_args(argv)
        if extra:
            args.subparser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.cmd = cmd
        return args.run(args)
    except (UsageError, LoaderError) as exc:
        print(f"mmiotrace-ng: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClosedPipe:
        return closed_pipe()
    except KeyboardInterrupt:
        return 130
