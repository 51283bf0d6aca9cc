"""`mmiotrace-ng replay TRACE --pci BDF`: play a trace's accesses back to a
device from user space, reads checked, polls waited for; --bisect finds the
write after which a check command succeeds.

Everything is checked before the first access: the trace (plan.py), the
device's BAR layout against the trace's, that no driver is bound (unless
--force; vfio-pci is the way in, not a driver that races the replay).
Exit status: 0 every read as recorded (bisect: the write found), 1 a
mismatch (bisect: none found), 2 trouble, 130 stopped (SIGINT, or q at a
--step prompt).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Final

from ..analysis.tracefile import Trace, TraceError
from ..common.errors import UsageError
from ..tracer import pci
from .device import Device, DeviceError, DeviceInfo, SysfsDevice, describe
from .plan import Plan, PlanError, Selection, Step, make_plan
from .player import Options, Outcome, Player, TraceWriter
from .vfio import VfioDevice

EXIT_MISMATCH: Final = 1
EXIT_STOPPED: Final = 130
PROC_PCI: Final = "/proc/bus/pci/devices"
PREFIX: Final = "mmiotrace-ng: replay: "
VFIO_DRIVER: Final = "vfio-pci"

EPILOG = """\
Writes are made with their width and value, reads are made and compared; a
run of reads of one register whose values are all the same but the last's
(a poll) is read until the last value comes, for up to --poll-timeout
seconds.  A mismatch prints the trace's line number, the expected and the
read value, and stops (--keep-going goes on).  Addresses are rebased BAR by
BAR, by their offset, from the trace's PCIDEV line of the device (or taken as
they are from its MAP lines if it has none).  Only the device's BARs are
mapped (sysfs resourceN; through VFIO where the device is bound to vfio-pci,
which lockdown allows), every access is checked against its BAR's size, and
Ctrl-C stops between two accesses.

Refused, with one line and exit status 2, before anything is touched: a
driver bound to the device (unless --force), a trace whose BARs (numbers and
sizes) are not the device's, a damaged trace (a line that is not a trace
line, an access past its BAR, lost events, an UNKNOWN access).

The replay's own trace (-o, standard output by default) is 20070824 text at
the device's addresses, to compare with the trace replayed:
mmiotrace-ng diff --ignore-header TRACE REPLAYED.

--bisect --check CMD finds the shortest prefix of the writes after which
CMD (sh -c) exits 0: without --reset, CMD runs after each write in turn;
with --reset CMD2, each try starts with CMD2 (which must bring the device
back to its state before the trace) and the prefixes are bisected.

exit status:
  0    every read as recorded (bisect: the write found)
  1    a mismatch (bisect: no prefix makes CMD succeed, or the empty one does)
  2    trouble: a refusal, bad options, a device that cannot be used
  130  stopped: Ctrl-C, or q at a --step prompt

examples:
  echo 0000:01:00.0 > /sys/bus/pci/drivers/DRIVER/unbind
  mmiotrace-ng replay load.rec --pci 01:00.0 -o replayed.txt
  mmiotrace-ng diff --ignore-header load.rec replayed.txt
  mmiotrace-ng replay load.txt --pci 01:00.0 --from 'init begin' --until 'init end'
  mmiotrace-ng replay load.txt --pci 01:00.0 --lines 120-480 --keep-timing --step
  mmiotrace-ng replay load.rec --pci 01:00.0 --only-writes --dry-run
  mmiotrace-ng replay load.rec --pci 01:00.0 --bisect \\
      --check 'test "$(busybox devmem 0xfea00004 32)" = 0x00000001'
"""


def _lines(text: str) -> tuple[int, int | None]:
    """--lines A-B, A-, -B or A: the first and last line (None: to the end)."""
    first, dash, last = text.partition("-")
    try:
        a = int(first) if first else 1
        b = (int(last) if last else None) if dash else a
    except ValueError:
        raise argparse.ArgumentTypeError(f"not lines: {text!r} (give e.g. 120-480)") from None
    if a < 1 or (b is not None and b < a):
        raise argparse.ArgumentTypeError(f"not lines: {text!r} (give e.g. 120-480)")
    return a, b


def _seconds(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        n = -1.0
    if not n > 0:
        raise argparse.ArgumentTypeError(f"not a number of seconds > 0: {text!r}")
    return n


def _address(text: str) -> pci.PciAddress:
    try:
        return pci.parse_address(text)
    except pci.BadPciAddress as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def setup(ap: argparse.ArgumentParser) -> None:
    from ..common.helpformat import ExamplesFormatter

    ap.formatter_class = ExamplesFormatter
    ap.epilog = EPILOG
    ap.add_argument("trace", metavar="TRACE",
                    help="a trace: text (20070824, of mmiotrace-ng or the kernel's "
                         "tracer) or recorded; - for standard input")
    ap.add_argument("--pci", required=True, type=_address, metavar="BDF",
                    help="the device to replay to, e.g. 01:00.0 (see lspci -D)")
    ap.add_argument("-o", "--output", metavar="OUT",
                    help="write the replay's own trace here (default: standard output)")
    ap.add_argument("--force", action="store_true",
                    help="replay although a driver is bound to the device")
    ap.add_argument("--poll-timeout", type=_seconds, default=1.0, metavar="SECONDS",
                    help="how long a poll waits for its last value (default 1)")
    ap.add_argument("--keep-going", action="store_true",
                    help="go on after a mismatch (exit status 1 all the same)")
    ap.add_argument("--from", dest="start_mark", metavar="MARK",
                    help="start after the first MARK line with this text")
    ap.add_argument("--until", dest="stop_mark", metavar="MARK",
                    help="stop at the next MARK line with this text")
    ap.add_argument("--lines", type=_lines, metavar="A-B",
                    help="only the trace's lines A to B (A-: to the end; -B: from the "
                         "start), numbered as in the text (report's for a recording)")
    ap.add_argument("--only-writes", action="store_true",
                    help="make the writes only, no read (as envytools' nvammiotracereplay)")
    ap.add_argument("--step", action="store_true",
                    help="wait for Enter before each access (q: stop)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print what would be done; touch nothing")
    ap.add_argument("--keep-timing", action="store_true",
                    help="keep the recorded gaps between accesses (default: as fast as "
                         "the device allows)")
    ap.add_argument("--bisect", action="store_true",
                    help="find the shortest prefix of the writes after which --check "
                         "succeeds")
    ap.add_argument("--check", metavar="CMD",
                    help="with --bisect: the shell command that says whether the device "
                         "is as wanted (exit status 0)")
    ap.add_argument("--reset", metavar="CMD",
                    help="with --bisect: a shell command that resets the device before each "
                         "try; the tries are then bisected")


# --- running -------------------------------------------------------------------


class _Interrupt:
    """SIGINT noted, to stop between two accesses; at a --step prompt it
    stops the prompt too."""

    def __init__(self) -> None:
        self.hit = False
        self.prompting = False

    def __enter__(self) -> _Interrupt:
        self._old = signal.signal(signal.SIGINT, self._on)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._old)

    def _on(self, signum: int, frame: FrameType | None) -> None:
        self.hit = True
        if self.prompting:
            raise KeyboardInterrupt

    def __call__(self) -> bool:
        return self.hit


def _say(text: str) -> None:
    print(PREFIX + text, file=sys.stderr, flush=True)


def _confirm(interrupt: _Interrupt) -> Callable[[Step], bool]:
    def confirm(s: Step) -> bool:
        what = (f"W {s.width} {s.phys:#x} {s.value:#x}" if s.kind == "W" else
                f"R {s.width} {s.phys:#x} (expect {s.value:#x})")
        print(f"line {s.line}: {what} [Enter: do it, q: stop] ", end="", file=sys.stderr,
              flush=True)
        interrupt.prompting = True
        try:
            answer = sys.stdin.readline()
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return False
        finally:
            interrupt.prompting = False
        return bool(answer) and answer.strip().lower() not in ("q", "quit")
    return confirm


def _pcidev_line(info: DeviceInfo, proc_pci: str) -> str | None:
    """The device's PCIDEV line, made as the tracer makes it (None if
    /proc/bus/pci/devices cannot be read)."""
    from ..format.render import pcidev_lines

    try:
        text = Path(proc_pci).read_text()
        lines = pcidev_lines(text)
    except (OSError, ValueError):
        return None
    ids = f"{info.vendor:04x}{info.device:04x}"
    want = f"PCIDEV {info.busdevfn:04x} {ids} "
    return next((line for line in lines if line.startswith(want)), None)


def _selection(args: argparse.Namespace) -> Selection:
    first, last = args.lines if args.lines else (1, None)
    return Selection(first, last, args.start_mark, args.stop_mark, args.only_writes)


def _check_options(args: argparse.Namespace) -> None:
    if args.bisect and not args.check:
        raise UsageError("--bisect needs --check CMD: the command that says whether the "
                         "device is as wanted")
    if (args.check or args.reset) and not args.bisect:
        raise UsageError("--check and --reset go with --bisect")
    if args.bisect and (args.output or args.dry_run or args.step):
        raise UsageError("--bisect writes no trace and makes no dry run or steps: leave out "
                         "-o, --dry-run and --step")
    if args.step and args.trace == "-":
        raise UsageError("--step reads its answers from standard input: the trace cannot "
                         "come from it")


def _open_trace(path: str) -> Trace:
    try:
        return Trace(path)
    except (TraceError, ValueError) as exc:   # rawfile.NotRawFile is a ValueError
        raise UsageError(str(exc)) from exc


def _plan(trace: Trace, args: argparse.Namespace, info: DeviceInfo) -> Plan:
    rec = trace.recording
    if rec is not None and rec.unverified:
        raise UsageError(f"{trace.name}: {rec.unverified} bytes of records fail their "
                         "checksums: the recording is damaged")
    try:
        return make_plan(trace.lines(), info, _selection(args))
    except PlanError as exc:
        raise UsageError(f"{trace.name}: {exc}") from exc
    except TraceError as exc:
        raise UsageError(str(exc)) from exc


def _dry_run(plan: Plan, info: DeviceInfo) -> None:
    out = sys.stdout
    for s in plan.steps:
        if s.kind == "MARK":
            out.write(f"line {s.line}: MARK {s.text}\n")
        elif s.kind == "MAP":
            out.write(f"line {s.line}: MAP BAR{s.bar}+{s.offset:#x} {s.length:#x}\n")
        elif s.kind == "UNMAP":
            out.write(f"line {s.line}: UNMAP\n")
        elif s.kind == "W":
            out.write(f"line {s.line}: W {s.width} BAR{s.bar}+{s.offset:#x} {s.value:#x} "
                      f"({s.phys:#x})\n")
        elif s.reads == 1:
            out.write(f"line {s.line}: R {s.width} BAR{s.bar}+{s.offset:#x} expect "
                      f"{s.value:#x} ({s.phys:#x})\n")
        else:
            out.write(f"lines {s.first_line}-{s.line}: R {s.width} BAR{s.bar}+{s.offset:#x} "
                      f"until {s.value:#x} ({s.phys:#x}; a poll of {s.reads} reads)\n")


def _notes(plan: Plan, info: DeviceInfo) -> None:
    if plan.other_accesses:
        _say(f"{plan.other_accesses} accesses of the trace to other devices left out")
    for text in plan.untraced:
        _say(f"the trace did not trace a mapping, its accesses are not replayed: {text}")


def _summary(info: DeviceInfo, out: Outcome) -> None:
    polls = f" ({out.polls} polls)" if out.polls else ""
    if out.mismatches:
        how = f"{len(out.mismatches)} mismatch" + ("es" if len(out.mismatches) > 1 else "")
    else:
        how = "every read as recorded" if out.reads else "no read made"
    _say(f"{info.address}: {out.writes} writes, {out.reads} reads{polls}: {how}")


def open_bars(info: DeviceInfo, bars: set[int]) -> Device:
    """The device's BARs: through VFIO where vfio-pci is its driver, else
    through its sysfs resource files."""
    if info.driver == VFIO_DRIVER:
        return VfioDevice(info, bars)
    return SysfsDevice(info, bars)


def replay(args: argparse.Namespace, sysfs_root: str | os.PathLike[str] = "/sys",
           proc_pci: str = PROC_PCI,
           open_device: Callable[[DeviceInfo, set[int]], Device] | None = None) -> int:
    """The command, its device found under sysfs_root and opened with
    open_device (tests give others; by default VFIO for a device bound to
    vfio-pci, its sysfs resource files otherwise)."""
    _check_options(args)
    trace = _open_trace(args.trace)
    try:
        info = describe(str(args.pci), sysfs_root)
    except DeviceError as exc:
        raise UsageError(str(exc)) from exc
    plan = _plan(trace, args, info)
    racing = info.driver if info.driver != VFIO_DRIVER else None
    if args.dry_run:
        if racing:
            _say(f"{info.address} is bound to {info.driver}: a replay would be refused "
                 "(--force)")
        _notes(plan, info)
        _dry_run(plan, info)
        return 0
    if racing and not args.force:
        raise UsageError(f"{info.address} is bound to the driver {info.driver}: a replay "
                         "would race it; unbind it first (echo "
                         f"{info.address} > /sys/bus/pci/drivers/{info.driver}/unbind) or "
                         "give --force")
    _notes(plan, info)
    try:
        device = (open_device or open_bars)(info, plan.used_bars())
    except DeviceError as exc:
        raise UsageError(str(exc)) from exc
    if isinstance(device, VfioDevice):
        _say(f"{info.address}: through VFIO (IOMMU group {device.group})")
    try:
        with _Interrupt() as interrupt:
            if args.bisect:
                return _bisect(args, plan, device, interrupt)
            return _replay(args, plan, info, device, interrupt, proc_pci)
    except DeviceError as exc:
        raise UsageError(str(exc)) from exc
    finally:
        device.close()


def _options(args: argparse.Namespace, keep_going: bool | None = None) -> Options:
    return Options(args.poll_timeout, args.keep_going if keep_going is None else keep_going,
                   args.keep_timing)


def _stopped(s: Step) -> int:
    _say(f"stopped before line {s.line}")
    return EXIT_STOPPED


def _replay(args: argparse.Namespace, plan: Plan, info: DeviceInfo, device: Device,
            interrupt: _Interrupt, proc_pci: str) -> int:
    from ..common.output import writing

    with writing(args.output) as out:
        trace = TraceWriter(out, _pcidev_line(info, proc_pci))
        player = Player(device, _options(args), trace, interrupt, _say,
                        _confirm(interrupt) if args.step else None)
        outcome = player.play(plan.steps)
    _summary(info, outcome)
    if outcome.stopped_before is not None:
        return _stopped(outcome.stopped_before)
    return EXIT_MISMATCH if outcome.mismatches else 0


# --- bisect --------------------------------------------------------------------


def _shell(cmd: str, what: str) -> int:
    """Run cmd with sh -c, its output on stderr (stdout is the answer's)."""
    try:
        err: int | None = sys.stderr.fileno()
    except (OSError, ValueError):       # not a file (captured): its output copied
        err = None
    try:
        res = subprocess.run(["sh", "-c", cmd], check=False,
                             stdout=subprocess.PIPE if err is None else err,
                             stderr=subprocess.STDOUT if err is None else None)
    except OSError as exc:
        raise UsageError(f"cannot run the {what} command: {exc.strerror}") from exc
    if res.stdout:
        sys.stderr.write(res.stdout.decode(errors="replace"))
    if res.returncode in (126, 127):
        raise UsageError(f"cannot run the {what} command {cmd!r}: sh says {res.returncode} "
                         "(not found, or not executable)")
    return res.returncode


def _bisect(args: argparse.Namespace, plan: Plan, device: Device,
            interrupt: _Interrupt) -> int:
    steps = plan.steps
    writes = [i for i, s in enumerate(steps) if s.kind == "W"]
    if not writes:
        raise UsageError("nothing to bisect: no write to the device in the part replayed")
    n = len(writes)

    def check() -> bool:
        return _shell(args.check, "check") == 0

    def player() -> Player:
        return Player(device, _options(args, keep_going=True), None, interrupt,
                      lambda text: _say("bisect: " + text))

    def found(k: int) -> int:
        s = steps[writes[k - 1]]
        print(f"line {s.line}: {s.access()}: write {k} of {n}, the last of the shortest "
              "prefix after which the check succeeds")
        return 0

    if args.reset is None:
        if check():
            _say("bisect: the check succeeds before any write is replayed: nothing to find")
            return EXIT_MISMATCH

        def after(k: int, s: Step) -> bool:
            ok = check()
            _say(f"bisect: after write {k} of {n} (line {s.line}): the check "
                 + ("succeeds" if ok else "fails"))
            return ok

        outcome = player().play(steps, after)
        if outcome.stopped_before is not None:
            return _stopped(outcome.stopped_before)
        if outcome.ended_early:
            return found(outcome.writes)
        _say(f"bisect: the check still fails after all {n} writes")
        return EXIT_MISMATCH

    def attempt(k: int) -> bool:
        if _shell(args.reset, "reset") != 0:
            raise UsageError(f"the reset command {args.reset!r} failed")
        outcome = player().play(steps[:writes[k - 1] + 1] if k else [])
        if outcome.stopped_before is not None:
            raise _Stop(outcome.stopped_before)
        ok = check()
        _say(f"bisect: writes 1-{k} of {n}: the check " + ("succeeds" if ok else "fails")
             if k else "bisect: no write: the check " + ("succeeds" if ok else "fails"))
        return ok

    try:
        if not attempt(n):
            _say(f"bisect: the check fails after all {n} writes")
            return EXIT_MISMATCH
        if attempt(0):
            _say("bisect: the check succeeds before any write is replayed: nothing to find")
            return EXIT_MISMATCH
        lo, hi = 0, n           # the check fails after lo writes, succeeds after hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if attempt(mid):
                hi = mid
            else:
                lo = mid
    except _Stop as stop:
        return _stopped(stop.step)
    return found(hi)


class _Stop(Exception):
    def __init__(self, step: Step) -> None:
        self.step = step


def run(args: argparse.Namespace) -> int:
    return replay(args)
