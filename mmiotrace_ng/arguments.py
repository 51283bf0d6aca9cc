"""The command line of a trace and of `record`, parsed and checked whole
before anything starts: start.py begins getting the BPF programs only once
these parsers accepted the arguments, and a usage error is said before a
missing privilege.  It imports no more than argparse, pci (the address
syntax) and the helper's ABI constants, so that the early start stays early."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from . import __version__
from .format.abi import MMIOTNG_COMM_LEN, MMIOTNG_USER_MAX_COMMS, MMIOTNG_USER_MAX_PIDS
from .tracer import pci

PROG = "mmiotrace-ng"
DESCRIPTION = """\
Trace every MMIO access of PCI devices (ioremap, reads, writes, iounmap) with
all CPUs online, printing the kernel mmiotrace format 20070824."""
EXAMPLES = """examples:
  mmiotrace-ng --pci 01:00.0 > dump.txt         # trace one device until Ctrl-C
  mmiotrace-ng --pci 01:00.0 -- modprobe nouveau # trace while a command runs
  mmiotrace-ng --pci 0000:00:02.0 --pci 03:00.0 -o dump.txt
  mmiotrace-ng --all -- modprobe e1000           # every PCI device, like the kernel's tracer
  mmiotrace-ng --pci 01:00.0 --compat           # UNKNOWN where the kernel's decoder gives up
  mmiotrace-ng --pci 01:00.0 --raw dump.raw -o dump.txt
  mmiotrace-ng report --compat dump.raw          # the same trace, as the kernel would show it
  mmiotrace-ng record --pci 01:00.0@0 -o dump.rec -- modprobe X   # BAR 0 only, binary
  mmiotrace-ng report dump.rec > dump.txt        # the text of a recording
  mmiotrace-ng diff before.txt after.rec         # the same MMIO traffic? (exit 0/1)
  mmiotrace-ng annotate --regs e1000 dump.rec    # register names, callers, folded polls
  mmiotrace-ng export --chrome dump.json dump.rec  # open in ui.perfetto.dev
  mmiotrace-ng mark "X is up"                    # a MARK line in the running trace
  echo "X is up" > /sys/kernel/tracing/trace_marker   # the same
  mmiotrace-ng status                            # the helper's counters
  mmiotrace-ng --pci 01:00.0 --histogram -- modprobe e1000   # counts per register and function
  mmiotrace-ng ksym pid_max:rw- -- sysctl kernel.pid_max     # who reads and writes a variable
  mmiotrace-ng install-helper                    # the helper module from DKMS
  mmiotrace-ng --pci 01:00.0 --flight -- modprobe X   # keep the last accesses across a crash
  mmiotrace-ng recover                           # after the reboot: what they were, and why

Every FILE a command reads may be - (standard input).

exit status:
  0  done (a trace: after Ctrl-C/SIGTERM)
  1  diff: the traces differ
  2  bad usage or input (a command line, a file that is empty or not a trace),
     or an environment that cannot trace (not root, no kprobes, ...)
  the command's own status with -- CMD
"""
RECORD = "record"
RECORD_SUMMARY = "trace into a binary file, report it later"
RECORD_DESCRIPTION = (
    "Trace like mmiotrace-ng does, writing the binary records to FILE and no text: "
    "the drain is a copy, so a sustained rate of accesses is kept whole where text "
    "would fall behind.  The file keeps the machine's symbols and modules for "
    "annotate.  Print it with: mmiotrace-ng report FILE.")
RECORD_BUFFER_KB = 65536    # record's default: a 3.2 MB blit when no reader runs beside it


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Lists the subcommands one a line, without the line of their metavar
    that argparse puts above them."""

    def _format_action(self, action: argparse.Action) -> str:
        if isinstance(action, argparse._SubParsersAction):
            return "".join(map(super()._format_action, action._get_subactions()))
        return super()._format_action(action)


class OneLineParser(argparse.ArgumentParser):
    """A usage error in one line, as every other error of the tool says
    itself: "mmiotrace-ng: MESSAGE (see mmiotrace-ng --help)", status 2.
    Its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: {message} (see {self.prog} --help)\n")


def make_parser(**kwargs: object) -> argparse.ArgumentParser:
    return OneLineParser(prog=PROG, description=DESCRIPTION, epilog=EXAMPLES,
                         formatter_class=HelpFormatter, **kwargs)


def add_text_options(ap: argparse.ArgumentParser) -> None:
    """How the records are printed: tracing and report share these."""
    ap.add_argument("--compat", action="store_true",
                    help="print UNKNOWN where the kernel's decoder would, not the decoded R/W")
    ap.add_argument("--pc", action="store_true", help="print instruction addresses")
    ap.add_argument("--pid", action="store_true", help="print process ids")
    ap.add_argument("--irq", action="store_true",
                    help="add the traced devices' interrupts as MARK lines: each hard handler's "
                         "entry and exit, e.g. 'MARK 12.000100 irq 24 0000:00:05.0 enter "
                         "edu' and '... exit handled' (recordings always keep them)")
    ap.add_argument("--dma", action="store_true",
                    help="add the traced devices' DMA mappings (Linux 6.12 and later) as MARK "
                         "lines, e.g. 'MARK 12.000100 dma map 0000:00:05.0 0x1f3a000 4096 "
                         "to-device' (recordings always keep them)")


def add_selection_options(ap: argparse.ArgumentParser) -> None:
    """What is traced, and how: tracing and record share these."""
    ap.add_argument("--pci", action="append", default=[], metavar="BDF[@BARS]",
                    help="device to trace, e.g. 01:00.0 or 0000:01:00.0 (repeatable); "
                         "@BARS traces only those memory BARs, e.g. 01:00.0@0 or @0,2")
    ap.add_argument("--all", action="store_true",
                    help="trace every PCI device's memory BARs and ROMs, devices a driver "
                         "binds to while tracing included (a rescan, a hot-plug, a driver "
                         "loaded meanwhile), mappings made after the start only, as the "
                         "kernel's tracer does; other ioremaps (not PCI) get MAP/UNMAP "
                         "lines, not their accesses, which the kernel's tracer also shows")
    ap.add_argument("--buffer-size-kb", type=int, default=16384, metavar="KB",
                    help="ring buffer size (default %(default)s)")
    ap.add_argument("--no-existing", action="store_true",
                    help="do not trace mappings that exist before the start (--all never does)")
    ap.add_argument("--no-user", action="store_true",
                    help="do not trace the traced BARs' mappings into processes (an mmap of a "
                         "sysfs resourceN file, a driver's mmap): say them only")
    ap.add_argument("--user", action="append", default=[], metavar="PID|NAME",
                    help="trace the traced BARs' mappings of this process only (a process id, "
                         "or a name as ps -o comm shows it: a thread's or its process's, "
                         "which a fork keeps); repeat for more (up to 16 ids and 8 names); "
                         "other processes' accesses run untraced")
    ap.add_argument("--singlestep", action="store_true",
                    help="single-step every access instead of emulating (slow; for tests)")
    ap.add_argument("--flight", type=int, nargs="?", const=4096, metavar="N",
                    help="flight recorder: also keep the last N accesses of each CPU (default "
                         "4096) in reserved memory that a warm reboot keeps; after a panic, "
                         "an oops or a lockup, 'mmiotrace-ng recover' prints them (setup: "
                         "the README's flight recorder section)")
    ap.add_argument("--flight-region", metavar="SIZE@ADDR",
                    help="the reserved memory for --flight (default: the kernel command "
                         "line's memmap=SIZE$ADDR reservation)")
    ap.add_argument("--sync", action="store_true",
                    help="an access waits (up to 1 s) until its record is in the output file "
                         "and flushed to the disk, for a machine that may die without a trace "
                         "of it: slow; accesses from atomic contexts (interrupt handlers, "
                         "spinlocks) do not wait, the next one that can waits for them too")
    ap.add_argument("--helper", metavar="KO", help="helper module to load (default: find or build)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print the time each start-up phase took on stderr")


def add_trace_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_selection_options(ap)
    ap.add_argument("-o", "--output", metavar="FILE",
                    help="write the trace here, not stdout (- : stdout)")
    add_text_options(ap)
    ap.add_argument("--raw", metavar="FILE",
                    help="also record the binary records here (see: mmiotrace-ng report)")
    ap.add_argument("--histogram", action="store_true",
                    help="count accesses per (R/W, width, BAR offset, function) in the kernel "
                         "and print that table at the end (and every -i seconds) instead of "
                         "the trace")
    ap.add_argument("-i", "--interval", type=float, metavar="SECONDS",
                    help="with --histogram: print the table (counts so far) this often")


def add_command(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("cmd", nargs=argparse.REMAINDER,
                    help="-- CMD ARGS: run CMD once tracing is armed, stop when it exits")


class _FullHelp(argparse.Action):
    """-h of the trace parser: the help of the whole command line, subcommands included."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from .cli import build_parser

        build_parser().print_help()
        parser.exit()


def trace_parser() -> argparse.ArgumentParser:
    """The parser of a trace (the default command: no subcommand word first)."""
    ap = make_parser(add_help=False)
    ap.add_argument("-h", "--help", action=_FullHelp, help="show this help message and exit")
    add_trace_options(ap)
    add_command(ap)
    return ap


def record_setup(ap: argparse.ArgumentParser) -> None:
    add_selection_options(ap)
    # A rep movs (a memcpy_toio blit) makes a record per element; the reader
    # drains them from another CPU as they come (the helper emulates a few
    # elements per fault), but where it shares the blit's CPU it runs only
    # after the instruction: 64 MiB hold 838000 records, a blit of 3.2 MB.
    ap.set_defaults(buffer_size_kb=RECORD_BUFFER_KB)
    ap.add_argument("-o", "--output", metavar="FILE", required=True,
                    help="the recording to write (read it with: mmiotrace-ng report FILE)")
    add_command(ap)


def record_parser() -> argparse.ArgumentParser:
    """The parser of `record`, as `mmiotrace-ng record` has it."""
    ap = OneLineParser(prog=f"{PROG} {RECORD}", description=RECORD_DESCRIPTION)
    record_setup(ap)
    return ap


def _parse_selection(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """What a trace and a record share: the options, the command after --,
    the devices to trace."""
    args = ap.parse_args(argv)
    _take_command(ap, args)
    check_selection(ap, args)
    return args


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options of a trace (exit status 2, with argparse's message, if bad)."""
    ap = trace_parser()
    args = _parse_selection(ap, argv)
    if args.output == "-":
        args.output = None      # standard output
    if args.interval is not None and (not args.histogram or args.interval <= 0):
        ap.error("-i SECONDS needs --histogram and a positive number")
    if args.histogram and args.sync:
        ap.error("--histogram keeps counts, not records: no --sync with it")
    if args.histogram and (args.raw or args.compat or args.irq or args.dma):
        ap.error("--histogram keeps counts, not records: no --raw, --compat, --irq or --dma "
                 "with it")
    return args


def parse_record(argv: list[str]) -> argparse.Namespace:
    """The options of `record` (argv without the word record)."""
    return _parse_selection(record_parser(), argv)


def parse_tracing(argv: list[str]) -> argparse.Namespace:
    """A trace's or a record's command line, checked (exit status 2 if
    bad); args.command says which: "trace" or "record"."""
    if argv[:1] == [RECORD]:
        args = parse_record(argv[1:])
        args.command = RECORD
    else:
        args = parse_args(argv)
        args.command = "trace"
    return args


def _take_command(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.cmd and args.cmd[0] == "--":
        args.cmd = args.cmd[1:]
    elif args.cmd:
        ap.error(f"unexpected argument {args.cmd[0]!r} (put the command after --)")


def check_selection(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.pci and not args.all:
        ap.error("nothing to trace: give --pci BDF (or --all)")
    for spec in args.pci:
        try:
            pci.parse_spec(spec)
        except pci.BadPciAddress as exc:
            ap.error(str(exc))
    if args.flight is not None and not 16 <= args.flight <= 1 << 24:
        ap.error("--flight N: N records per CPU, 16 to 16777216")
    if args.flight_region and args.flight is None:
        ap.error("--flight-region needs --flight")
    if args.buffer_size_kb < 4:
        ap.error("--buffer-size-kb must be at least 4")
    check_user(ap, args)


def check_user(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--user: its process ids and names, apart (user_pids, user_names)."""
    specs = args.user
    args.user_pids = pids = [int(s) for s in specs if s.isdigit()]
    args.user_names = names = [s for s in specs if not s.isdigit()]
    if not specs:
        return
    if args.no_user:
        ap.error("--user names processes to trace, --no-user traces none: not both")
    if any(p <= 0 for p in pids) or any(not n or len(n.encode()) > MMIOTNG_COMM_LEN - 1
                                       for n in names):
        ap.error(f"--user PID|NAME: a process id, or a name of at most "
                 f"{MMIOTNG_COMM_LEN - 1} bytes (the kernel keeps no more of it)")
    if len(pids) > MMIOTNG_USER_MAX_PIDS or len(names) > MMIOTNG_USER_MAX_COMMS:
        ap.error(f"--user: at most {MMIOTNG_USER_MAX_PIDS} process ids and "
                 f"{MMIOTNG_USER_MAX_COMMS} names")
    for pid in pids:
        if not os.path.isdir(f"/proc/{pid}"):
            ap.error(f"--user {pid}: no such process")
