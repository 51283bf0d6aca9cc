"""`mmiotrace-ng ksym`: the command, from its arguments to its exit status."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import signal
import sys
import time
from typing import BinaryIO

from ..common.bpfload import LoaderError
from ..common.child import ended as child_ended
from ..common.child import start as start_child
from ..common.errors import EXIT_USAGE, UsageError
from ..common.ringbuf import payloads
from ..common.symbols import Kallsyms, SymbolError
from .output import Options, header, histogram_table, hit_line, lost_line
from .records import NgKsymHit
from .request import RequestError, Watch, resolve

DESCRIPTION = """\
Watch reads and writes of kernel variables with the CPU's hardware
breakpoints (x86 debug registers: up to 4 watches, on every CPU, CPUs that
come online later included).  A line per access, or with --histogram counts
per (access type, symbol, function) kept in the kernel.

REQUEST is [MODULE:]SYMBOL[+OFF][/LEN]:OP with OP rw- (reads and writes) or
-w- (writes; x86 has no read-only data breakpoint) and LEN 1, 2, 4 or 8
(default: the symbol's size when it is one of those, else 8).  Function is
where the CPU was right after the access, as name+0xoff/0xsize [module]."""
EXAMPLES = """examples:
  mmiotrace-ng ksym pid_max:rw- -- sysctl kernel.pid_max   # every access while sysctl runs
  mmiotrace-ng ksym jiffies_64:-w- --histogram -i 1        # counts per function, each second
  mmiotrace-ng ksym e1000:e1000_driver_name:rw-            # a module's symbol
  mmiotrace-ng ksym pid_max/4:-w- --timestamps --value -o hits.txt
"""
BATCH = 4096


SUMMARY = "watch reads and writes of kernel variables (hardware breakpoints)"


def setup(ap: argparse.ArgumentParser) -> None:
    """ksym's arguments (`-- CMD ARGS` is cut off before they are parsed)."""
    ap.description = DESCRIPTION
    ap.epilog = EXAMPLES
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.usage = "%(prog)s [options] REQUEST... [-- CMD ARGS]"
    ap.add_argument("requests", nargs="+", metavar="REQUEST")
    ap.add_argument("-o", "--output", metavar="FILE", help="write here, not stdout")
    ap.add_argument("--timestamps", action="store_true",
                    help="add the time of each access (seconds.microseconds, CLOCK_MONOTONIC)")
    ap.add_argument("--value", action="store_true",
                    help="add the variable's value after each access")
    ap.add_argument("--histogram", action="store_true",
                    help="count per (type, symbol, function) in the kernel; print the table "
                         "at exit (and every -i seconds), no line per access")
    ap.add_argument("-i", "--interval", type=float, metavar="SECONDS",
                    help="with --histogram: print the table (counts so far) this often")
    ap.add_argument("--buffer-size-kb", type=int, default=4096, metavar="KB",
                    help="ring buffer for the hits (default 4096)")


def check_args(args: argparse.Namespace) -> None:
    ap = args.subparser
    if args.interval is not None and (not args.histogram or args.interval <= 0):
        ap.error("-i SECONDS needs --histogram and a positive number")
    if (args.timestamps or args.value) and args.histogram:
        ap.error("--timestamps and --value are for the line per access, not --histogram")
    if args.buffer_size_kb <= 0:
        ap.error("--buffer-size-kb must be positive")


class Run:
    """One ksym session: probes, output, counts."""

    def __init__(self, args: argparse.Namespace, watches: list[Watch], syms: Kallsyms,
                 out: BinaryIO) -> None:
        from .probes import KsymProbes

        self.args, self.watches, self.syms, self.out = args, watches, syms, out
        self.opts = Options(args.timestamps, args.value)
        self.probes = KsymProbes(watches, args.histogram, args.buffer_size_kb)
        self.records = [0] * len(watches)
        self.lost = 0
        self.stop = False

    def write(self, text: str) -> None:
        self.out.write(text.encode(errors="replace"))

    def pump(self, timeout_ms: int) -> None:
        ring = self.probes.ring
        assert ring is not None
        view = ring.pending()
        if not view:
            ring.wait(timeout_ms)
            view = ring.pending()
        if not view:
            return
        recs, used = payloads(view, BATCH)
        view.release()
        ring.consume(used)
        lines = []
        for raw in recs:
            hit = NgKsymHit.from_buffer_copy(raw.ljust(ctypes.sizeof(NgKsymHit), b"\0"))
            if hit.lost:
                lines.append(lost_line(hit.lost))
                self.lost += hit.lost
            if hit.slot < len(self.watches):
                self.records[hit.slot] += 1
                lines.append(hit_line(hit, self.watches[hit.slot], self.syms.function,
                                      self.opts))
        self.write("".join(lines))
        self.out.flush()

    def table(self) -> str:
        counts, full = self.probes.histogram()
        text = histogram_table(counts, self.watches, self.syms.function)
        if full:
            text += f"# {full} hits not counted: the histogram map was full\n"
        return text

    def finish(self) -> None:
        if self.args.histogram:
            return
        while True:
            before = sum(self.records) + self.lost
            self.pump(0)
            if sum(self.records) + self.lost == before:
                break
        _total, pending = self.probes.drops()
        if pending:
            self.write(lost_line(pending))
            self.lost += pending
        self.out.flush()


def start(args: argparse.Namespace) -> tuple[list[Watch], Kallsyms]:
    if os.geteuid() != 0:
        raise UsageError("must be run as root (hardware breakpoints on kernel addresses)")
    try:
        syms = Kallsyms()
    except SymbolError as exc:
        raise UsageError(str(exc)) from exc
    try:
        watches = resolve(args.requests, syms)
    except RequestError as exc:
        raise UsageError(str(exc)) from exc
    return watches, syms


def run(args: argparse.Namespace) -> int:
    check_args(args)
    watches, syms = start(args)
    for w in watches:
        if w.note:
            print(f"mmiotrace-ng: {w.note}", file=sys.stderr)
    try:
        out: BinaryIO = open(args.output, "wb") if args.output else sys.stdout.buffer
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror}") from exc
    try:
        session = Run(args, watches, syms, out)
    except LoaderError as exc:
        if args.output:
            out.close()
        raise UsageError(str(exc)) from exc

    def on_signal(signum: int, frame: object) -> None:
        session.stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    status = 0
    try:
        if not args.histogram:
            session.write(header(session.opts))
            out.flush()
        print("mmiotrace-ng: ready, watching "
              + ", ".join(f"{w.text} ({w.type}, {w.len} bytes at 0x{w.addr:x})"
                          for w in watches), file=sys.stderr, flush=True)
        child = start_child(args.cmd)
        next_table = time.monotonic() + (args.interval or 0)
        next_cpus = time.monotonic() + 0.5
        while not session.stop:
            session.pump(100)
            now = time.monotonic()
            if now >= next_cpus:
                session.probes.refresh()
                next_cpus = now + 0.5
            if args.interval and now >= next_table:
                session.write(time.strftime("%H:%M:%S\n") + session.table() + "\n")
                out.flush()
                next_table += args.interval
            if (ended := child_ended(child)) is not None:
                status = ended
                break
        session.finish()
        counted = session.probes.counts()
        if args.histogram:
            counts, full = session.probes.histogram()
            seen = sum(counts.values()) + full
            session.write(session.table())
            out.flush()
        else:
            seen = sum(session.records) + session.lost
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            return 128 + signal.SIGPIPE
        print(f"mmiotrace-ng: cannot write to {args.output or 'standard output'}: "
              f"{exc.strerror}; stopped, no breakpoint left", file=sys.stderr)
        return EXIT_USAGE
    finally:
        session.probes.close()
        if args.output:
            with contextlib.suppress(OSError):
                out.close()
    per = ", ".join(f"{w.text} {n}" for w, n in zip(watches, counted, strict=True))
    # perf counts every hit; the program misses those that come while
    # another BPF program runs on that CPU (the kernel runs one at a time)
    missed = sum(counted) - seen
    tail = (f", {missed} not seen by the BPF program (another BPF program was running)"
            if missed > 0 else "")
    if args.histogram:
        print(f"mmiotrace-ng: {sum(counted)} hits ({per}){tail}", file=sys.stderr)
    else:
        print(f"mmiotrace-ng: {sum(session.records)} hits printed ({per} counted), "
              f"lost {session.lost}{tail}", file=sys.stderr)
    return status
