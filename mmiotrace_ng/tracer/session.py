"""One tracing run of the live MMIO tracer (mmiotrace-ng [OPTIONS] and
mmiotrace-ng record): the machine checked, the helper loaded and given
the ranges to trace, the BPF programs attached, the records drained into
the 20070824 text or a recording until Ctrl-C or the command's end."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final

from .. import __version__
from ..common import ringbuf
from ..common.bpfload import LoaderError
from ..common.child import ended as child_ended
from ..common.child import start as start_child
from ..common.errors import EXIT_USAGE, UsageError
from ..common.output import closed_pipe
from ..common.phases import PHASES
from ..format.abi import MMIOTNG_MAX_FILTERS, MMIOTNG_MODE_SINGLESTEP
from ..format.records import NgRecAccess, NgRecHdr, NgRecType, record_sizes
from ..format.render import ENCODING, ERRORS, Renderer, lost_line, stream_header
from . import pci, usermaps
from .loader import Probes
from .vmalloc import existing_mappings, read_vmallocinfo

if TYPE_CHECKING:   # imported where used: only recordings need them
    from ..format.rawfile import RawWriter

TRACING = Path("/sys/kernel/tracing")
LOCK_PATH = "/run/mmiotrace-ng.lock"
PROBES_OFF = ("kprobes are disabled (/sys/kernel/debug/kprobes/enabled is 0): the helper "
              "cannot see ioremap and iounmap")
HELPER_CHECK_S = 0.25   # how often the loop asks the helper whether kprobes still fire
BATCH = 16384   # records printed per pump at most: Ctrl-C is seen between
RECORD_BATCH = 16384    # records copied per pump at most: their space is
                        # handed back a megabyte at a time, not all at once


def check_environment() -> None:
    if os.geteuid() != 0:
        raise UsageError("must be run as root (it loads a kernel module and BPF programs)")
    if not Path("/sys/kernel/debug/kprobes").exists() and not Path(
            "/sys/bus/event_source/devices/kprobe").exists():
        raise UsageError("this kernel has no kprobes (CONFIG_KPROBES)")
    if not Path("/sys/kernel/btf/vmlinux").exists():
        raise UsageError("this kernel has no BTF (CONFIG_DEBUG_INFO_BTF)")
    if kernel_mmiotrace_active():
        raise UsageError("the kernel's own mmiotrace is active; stop it first: "
                         "echo nop > /sys/kernel/tracing/current_tracer")
    from ..common import requirements

    lockdown = requirements.check_lockdown(Path("/"))
    if lockdown.ok is False:
        raise UsageError(f"the kernel is locked down, {lockdown.detail} (mmiotrace-ng check)")
    # the rest of what `check` looks at, the first failure said as it says it
    blocker = requirements.trace_blocker(checkout_ko=Path(__file__).resolve().parents[2] / "kmod"
                                   / "mmiotng.ko")
    if blocker is not None:
        raise UsageError(f"{blocker.name}: {blocker.detail} (mmiotrace-ng check lists "
                         "every requirement)")


def kernel_mmiotrace_active() -> bool:
    for base in (TRACING, Path("/sys/kernel/debug/tracing")):
        try:
            return (base / "current_tracer").read_text().strip() == "mmiotrace"
        except OSError:
            continue
    return False


def single_instance() -> int:
    """Hold a lock for this run; UsageError if another instance holds it."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise UsageError("another mmiotrace-ng is running") from None
        raise
    return fd


# why a process's mappings are not traced on some kernels (PREEMPT_RT's)
NO_NUMA_BALANCING: Final = ("this kernel has no NUMA balancing (CONFIG_NUMA_BALANCING; "
                            "PREEMPT_RT kernels have none), whose PROT_NONE page-table entries "
                            "arming them needs")


class OutputError(Exception):
    """The trace could not be written (a closed pipe, a full disk): tracing stops."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(exc.strerror)
        self.exc = exc


def recording_meta() -> dict:
    """What a recording says of where and how it was made (its META)."""
    u = os.uname()
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return {"format": 2, "tool": f"mmiotrace-ng {__version__}", "kernel": u.release,
            "machine": u.machine, "host": u.nodename, "boot_id": boot,
            "started": time.time(), "argv": sys.argv, "record_sizes": record_sizes()}


_HDR = NgRecHdr.ts_ns.offset, NgRecHdr.cpu.offset


def newest_stamps(view: memoryview) -> dict[int, int]:
    """The newest timestamp of each CPU's records at the start of view
    (--sync: a CPU's records are in the ring in the order of their stamps)."""
    recs, _ = ringbuf.payloads(view)
    newest: dict[int, int] = {}
    for r in recs:
        if len(r) >= ctypes.sizeof(NgRecHdr):
            ts = int.from_bytes(r[_HDR[0]:_HDR[0] + 8], "little")
            cpu = int.from_bytes(r[_HDR[1]:_HDR[1] + 2], "little")
            newest[cpu] = max(newest.get(cpu, 0), ts)
    return newest


class Session:
    """One tracing run: helper filters, BPF probes, output."""

    def __init__(self, args: argparse.Namespace, out: BinaryIO,
                 raw: RawWriter | None = None) -> None:
        self.args = args
        self.out = out
        self.renderer = Renderer(compat=args.compat, show_pc=args.pc, show_pid=args.pid,
                                 irq=args.irq, dma=args.dma)
        self.stop = False
        self.helper = None
        self.probes: Probes | None = None
        self.raw = raw
        # a recording's symbols, modules unloaded while tracing included
        if raw:
            from ..format.symsnap import SymbolSnapshots
        self.snapshots = SymbolSnapshots() if raw else None
        self.record = getattr(args, "record", False)     # records only, no text
        self.access_size = ctypes.sizeof(NgRecAccess)
        self.regions: list = []          # --histogram: histogram.Region of each BAR
        self.devices: list[str] = []     # the traced devices' addresses (their interrupts)
        self.syms = None
        self.sync = getattr(args, "sync", False)

    def write(self, text: str) -> None:
        if text:
            try:
                self.out.write(text.encode(ENCODING, ERRORS))
            except OSError as exc:
                raise OutputError(exc) from exc

    def flush(self) -> None:
        try:
            self.out.flush()
        except OSError as exc:
            raise OutputError(exc) from exc

    @staticmethod
    def to_raw(write: Callable[..., None], *args: object) -> None:
        """A write into the recording (--raw, record): its errors stop the run
        as the text's do."""
        try:
            write(*args)
        except OSError as exc:
            raise OutputError(exc) from exc

    def start(self, ranges: list[tuple[int, int]]) -> None:
        from .netlink import HelperError, HelperSocket

        # The probes come first: every mapping armed below is seen from its
        # MAP on.  And the helper's socket is then the newest descriptor, which
        # the kernel releases first when this process dies (task work runs
        # last in, first out): a SIGKILL disarms everything before the probes
        # go, the order of a normal exit.
        print("mmiotrace-ng: loading and attaching the BPF programs ...", file=sys.stderr,
              flush=True)
        self.probes = Probes(self.args.all, self.args.buffer_size_kb,
                             histogram=self.args.histogram)
        user = not getattr(self.args, "no_user", False)
        held: list[tuple[int, int, int, int]] = []
        if not user:
            self.say_user_maps(ranges)
            # those processes hold already, said first (stamped before
            # anything the filters below make)
            held = [] if self.args.no_existing else usermaps.find(ranges)
            PHASES.done("mappings into processes before the start (/proc/PID/maps)")
        if not self.args.histogram:
            # recordings keep them always: report --irq, --dma show them
            notes = []
            if self.args.irq or self.raw:
                notes += self.probes.trace_irqs(self.devices)
            if self.args.dma or self.raw:
                dma = self.probes.trace_dma(self.devices)
                notes += dma if self.args.dma else []
            for note in notes:
                print(f"mmiotrace-ng: {note}", file=sys.stderr, flush=True)
        header = stream_header(Path("/proc/bus/pci/devices").read_text())
        PHASES.done("stream header")
        try:
            self.helper = HelperSocket()
            if getattr(self.args, "flight", None):
                self.start_flight(header)
            if self.args.all:
                # first: a device bound while the filters below go in is seen
                self.helper.trace_new_devices()
            for lo, hi in ranges:
                try:
                    self.helper.filter_add(lo, hi - lo)
                except HelperError as exc:
                    # --all: traced already, from the bind of its device just now
                    if not (self.args.all and exc.errno == errno.EEXIST):
                        raise
            if user and self.trace_user(ranges):
                # after TRACE_USER: a mapping made meanwhile is armed by the helper
                for m in [] if self.args.no_existing else usermaps.find(ranges):
                    if not self.arm_user(*m):
                        held.append(m)
                PHASES.done("mappings into processes before the start (/proc/PID/maps)")
            elif user and not self.args.no_existing:
                held = usermaps.find(ranges)
            if self.args.singlestep:
                self.helper.set_mode(MMIOTNG_MODE_SINGLESTEP)
            if getattr(self.args, "sync", False):
                self.helper.sync_ack(0, 0)  # accesses wait for their records from now on
            PHASES.done("helper session (netlink), filters")
        except HelperError as exc:
            if exc.errno == errno.EBUSY:
                raise UsageError(f"the helper is busy: {exc}") from exc
            if exc.errno == errno.EHOSTDOWN:
                raise UsageError(f"{PROBES_OFF}; enable them: echo 1 > "
                                 "/sys/kernel/debug/kprobes/enabled") from exc
            raise UsageError(f"the helper refused: {exc}") from exc
        if not self.args.histogram and not self.record:
            self.write(header)
        if self.raw:
            self.to_raw(self.raw.meta, recording_meta())
            self.to_raw(self.raw.header, header)
        self.inject(usermaps.records(held))
        if not self.args.no_existing and not self.args.all:
            # each gets its MAP record from the helper, or a NOT traced one
            found = existing_mappings(ranges, read_vmallocinfo())
            if any(not m.virt for m in found):
                print("mmiotrace-ng: kernel.kptr_restrict hides the addresses in "
                      "/proc/vmallocinfo: mappings made before the start are not traced "
                      "(kernel.kptr_restrict=1 shows them to root)", file=sys.stderr, flush=True)
                found = [m for m in found if m.virt]
            for m in found:
                with contextlib.suppress(HelperError):
                    # a refusal is said by the helper's NOT traced record (in
                    # the stream and on stderr); EEXIST: armed already, by
                    # the ioremap probe; EPERM: the helper's own mapping
                    self.helper.arm_existing(m.virt, m.size, m.phys)
            PHASES.done("mappings made before the start (vmallocinfo)")

    def say_user_maps(self, ranges: list[tuple[int, int]]) -> None:
        """The traced ranges' mappings into processes are said, not traced."""
        assert self.probes is not None
        for note in self.probes.report_user_maps(ranges):
            print(f"mmiotrace-ng: {note}", file=sys.stderr, flush=True)

    def trace_user(self, ranges: list[tuple[int, int]]) -> bool:
        """The helper traces the traced ranges' mappings into processes from
        now on; if it cannot, they are said (False)."""
        from .netlink import HelperError

        assert self.helper is not None
        pids = getattr(self.args, "user_pids", [])
        names = getattr(self.args, "user_names", [])
        try:
            self.helper.trace_user(pids, names)
        except HelperError as exc:
            if exc.errno == errno.ESRCH:
                raise UsageError(f"--user: a process of {' '.join(map(str, pids))} "
                                 f"is gone") from exc
            why = (NO_NUMA_BALANCING if exc.errno == errno.EOPNOTSUPP
                   else f"the helper cannot ({exc})")
            print(f"mmiotrace-ng: mappings of the traced ranges into processes are said, "
                  f"NOT traced: {why}", file=sys.stderr, flush=True)
            self.say_user_maps(ranges)
            return False
        assert self.probes is not None
        for note in self.probes.trace_user_unmaps():
            print(f"mmiotrace-ng: {note}", file=sys.stderr, flush=True)
        return True

    def arm_user(self, pid: int, virt: int, phys: int, size: int) -> bool:
        """Trace a mapping a process held before the start; False if the
        helper refused it (it is said, then)."""
        from .netlink import HelperError

        assert self.helper is not None
        try:
            self.helper.arm_user(pid, virt, size)
            return True
        except HelperError as exc:
            if exc.errno in (errno.ESRCH, errno.ENOENT):
                return True     # the process is gone, or not one --user names
            print(f"mmiotrace-ng: process {pid}'s mapping at 0x{virt:x} is NOT traced: {exc}",
                  file=sys.stderr, flush=True)
            return False

    def start_flight(self, header: str) -> None:
        """--flight: the helper keeps the last accesses in the reserved region,
        unless it holds a crash's records no one recovered yet."""
        from . import flight
        from .netlink import HelperError

        assert self.helper is not None
        where = flight.region(self.args.flight_region, Path("/proc/cmdline").read_text())
        try:
            old = flight.parse(flight.read_region(self.helper, where, flight.HEADER_BYTES),
                               header_only=True)
        except flight.FlightError:
            old = None
        except HelperError as exc:
            raise UsageError(f"--flight: the region {where}: {exc}") from exc
        if old is not None and old.crashed:
            raise UsageError(f"the flight region {where} holds the records of a crash "
                             f"({old.why()}): run 'mmiotrace-ng recover' first (recover "
                             "--clear lets them go)")
        try:
            self.helper.flight_start(where.addr, where.size, self.args.flight, header)
        except HelperError as exc:
            raise UsageError(f"--flight: the region {where}: {exc}") from exc
        kept = self.helper.status().flight_recs
        note = "" if kept >= self.args.flight else f" (only {kept} fit in {where.size} bytes)"
        print(f"mmiotrace-ng: flight recorder: the last {kept} accesses of each CPU kept in "
              f"{where}{note}", file=sys.stderr, flush=True)

    def pump(self, timeout_ms: int) -> None:
        """Print what the ring buffer holds (at most BATCH records), waiting
        up to timeout_ms for something."""
        assert self.probes is not None
        if self.snapshots is not None:
            self.snapshots.poll()
        if not self._render(self.probes.pending(timeout_ms),
                            RECORD_BATCH if self.record else BATCH):
            time.sleep(0.001)   # the oldest record is still being written

    def finish(self) -> None:
        """Stop new accesses, then print what is left in the ring buffer."""
        self.disarm()
        if self.probes is not None:
            self._render(self.probes.pending(0), None)
            total, pending = self.probes.drops()
            try:
                missed = self.probes.misses()
            except OSError as exc:
                missed = 0
                print(f"mmiotrace-ng: cannot read the BPF programs' skipped runs "
                      f"({exc.strerror}): records lost that way are not counted",
                      file=sys.stderr, flush=True)
            # said at the end: where they were lost is not known
            total += missed
            pending += missed
            if pending and not self.args.histogram and not self.record:
                self.write(lost_line(pending))
            self.renderer.lost = total
            if self.raw and self.snapshots:
                self.to_raw(self.raw.end, total, pending, *self.snapshots.final())
            if self.args.histogram:
                self.write(self.histogram())
            self.flush()

    def histogram(self) -> str:
        """--histogram: the table of the counts so far."""
        from ..common.symbols import Kallsyms
        from . import histogram

        assert self.probes is not None
        if self.syms is None:
            self.syms = Kallsyms()
        counts, full = self.probes.histogram()
        return histogram.table(counts, self.regions, self.syms.function, full)

    def _render(self, view: memoryview, limit: int | None) -> bool:
        """Print the records at the start of view and release their space;
        False if there were some but none was ready."""
        assert self.probes is not None
        if not view:
            return True
        text, used = self._feed(view, limit)
        newest = newest_stamps(view[:used]) if self.sync else {}
        view.release()
        self.probes.consume(used)   # after the copies: the space is reused
        self._write_text(text)
        if newest:
            self.synced(newest)
        return used > 0

    def _feed(self, view: memoryview, limit: int | None) -> tuple[str, int]:
        """The text of the records at the start of view (none when
        recording: they are counted) and the bytes they take; the NOT traced
        ones said on stderr, all of them copied into the recording."""
        if self.record:
            # the records as they are: counted, and the few that are not
            # accesses read (for the summary and the NOT traced notes)
            text = ""
            used, accesses, others = ringbuf.committed(view, self.access_size, limit)
            self.renderer.counts[NgRecType.NG_REC_ACCESS] += accesses
            for rec in others:
                self.renderer.feed(rec)
            others.clear()
        else:
            text, used = self.renderer.feed_ring(view, limit)
        for note in self.renderer.untraced:
            print(note, file=sys.stderr, flush=True)
        self.renderer.untraced.clear()
        if self.raw and used:
            self.to_raw(self.raw.ring, view[:used])
        return text, used

    def _write_text(self, text: str) -> None:
        if text and not self.args.histogram:
            self.write(text)
            self.flush()

    def inject(self, records: list[bytes]) -> None:
        """Records made here, not by the BPF programs (mappings found at the
        start), into the stream as if they came from the ring buffer."""
        if records:
            text, _ = self._feed(memoryview(ringbuf.pack(records)), None)
            self._write_text(text)

    def synced(self, newest: dict[int, int]) -> None:
        """--sync: each CPU's records up to its newest stamp are written; on
        the disk, then the accesses that wait for them go on."""
        for fh in (self.out, self.raw.fh if self.raw else None):
            if fh is None:
                continue
            try:
                os.fdatasync(fh.fileno())
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EROFS):   # a pipe, a terminal
                    raise OutputError(exc) from exc
        if self.helper is not None:
            for cpu, ts in sorted(newest.items()):
                self.helper.sync_ack(cpu, ts)

    def helper_stopped(self) -> bool:
        """Whether the helper stopped tracing because kprobes are disabled
        (it sees ioremap and iounmap only through them): said on stderr;
        its MARK says it in the trace."""
        from .netlink import HelperError

        assert self.helper is not None
        try:
            off = self.helper.status().probes_off
        except HelperError as exc:
            raise UsageError(f"the helper does not answer: {exc}") from exc
        if off:
            print(f"mmiotrace-ng: {PROBES_OFF}; tracing stopped, nothing left armed",
                  file=sys.stderr, flush=True)
        return bool(off)

    def disarm(self) -> None:
        if self.helper is not None:
            try:
                self.helper.disarm_all()
            except Exception:  # noqa: BLE001 (closing the socket disarms too)
                pass
            self.helper.close()
            self.helper = None

    def close(self) -> None:
        if self.raw is not None:
            with contextlib.suppress(OSError):     # said already, by to_raw
                self.raw.close()
        self.disarm()
        if self.probes is not None:
            self.probes.close()
            self.probes = None


def trace(args: argparse.Namespace) -> int:
    if args.verbose:
        PHASES.enable()
    PHASES.done("arguments")
    check_environment()
    ranges: list[tuple[int, int]] = []
    if args.all:
        ranges = [(bar.start, bar.end + 1) for bar in pci.all_memory_ranges()]
    from .histogram import Region

    regions: list[Region] = []
    devices = pci.all_devices() if args.all else []
    for spec in args.pci:
        try:
            bdf, bars = pci.selected_bars(spec)
            if bdf not in devices:
                devices.append(bdf)
            for bar in bars:
                regions.append(Region(bdf, f"BAR{bar.index}", bar.start, bar.end))
                if (bar.start, bar.end + 1) not in ranges:
                    ranges.append((bar.start, bar.end + 1))
        except pci.PciError as exc:
            raise UsageError(str(exc)) from exc
    if len(ranges) > MMIOTNG_MAX_FILTERS:
        raise UsageError(f"{len(ranges)} BARs and ROMs to trace; the helper traces at most "
                         f"{MMIOTNG_MAX_FILTERS} at a time (fewer devices)")
    PHASES.done("environment checks, devices")
    lock = single_instance()
    # the output first: a file that cannot be written stops the run before
    # anything is loaded or armed
    raw: RawWriter | None = None
    try:
        out: BinaryIO = open(args.output, "wb") if args.output else sys.stdout.buffer
        if args.raw:
            from ..format.rawfile import RawWriter

            raw = RawWriter(args.raw)
    except OSError as exc:
        os.close(lock)
        raise UsageError(f"cannot write {exc.filename}: {exc.strerror}") from exc
    from .kmodload import ensure_loaded
    from .loader import start_compile

    try:
        # the BPF programs compile (a first start) while the helper loads
        start_compile()
        ensure_loaded(args.helper)
        PHASES.done("helper module")
    except LoaderError:
        os.close(lock)
        if args.output:
            out.close()
        if raw:
            raw.close()
        raise
    session = Session(args, out, raw)
    session.regions = regions
    session.devices = devices
    status = 0
    failed: OSError | None = None

    def on_signal(signum: int, frame: object) -> None:
        session.stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        session.start(ranges)
        session.flush()
        print("mmiotrace-ng: ready, tracing "
              + ("every PCI device" if args.all else ", ".join(args.pci)),
              file=sys.stderr, flush=True)
        child = start_child(args.cmd)
        next_table = time.monotonic() + (args.interval or 0)
        next_check = time.monotonic() + HELPER_CHECK_S
        while not session.stop:
            session.pump(1 if session.sync else 100)
            if time.monotonic() >= next_check:
                if session.helper_stopped():
                    status = EXIT_USAGE
                    break
                next_check = time.monotonic() + HELPER_CHECK_S
            if args.interval and time.monotonic() >= next_table:
                session.write(time.strftime("%H:%M:%S\n") + session.histogram() + "\n")
                session.flush()
                next_table += args.interval
            if (ended := child_ended(child)) is not None:
                status = ended
                break
        session.finish()
    except OutputError as exc:
        failed = exc.exc    # everything is disarmed and detached below
    finally:
        session.close()
        os.close(lock)
        if args.output:
            with contextlib.suppress(OSError):
                out.close()
    if failed is not None:
        return output_failed(failed, args.raw if session.record else args.output)
    r = session.renderer
    s = r.stats()
    where = ""
    if session.record:
        size = Path(args.raw).stat().st_size
        where = f" recorded in {args.raw} ({size / 1e6:.1f} MB)"
    print(f"mmiotrace-ng: {sum(r.counts.values())} records (map {s['map']}, unmap "
          f"{s['unmap']}, access {s['access']}, mark {s['mark']}){where}, lost {r.lost}"
          + (f", {s['untraced']} mappings NOT traced" if s["untraced"] else "")
          + (f", {s['irq']} interrupt records" if s["irq"] else "")
          + (f", {s['dma']} DMA records" if s["dma"] else "")
          + (f", {r.bad} corrupt records skipped" if r.bad else ""), file=sys.stderr)
    return status


def output_failed(exc: OSError, path: str | None) -> int:
    """Tracing stopped because the trace could not be written.  A closed
    pipe (mmiotrace-ng ... | head) ends it quietly, as a pipeline's tools do
    (128 + SIGPIPE); any other error says why, exit status 2."""
    if exc.errno == errno.EPIPE:
        return closed_pipe()
    where = path or "standard output"
    print(f"mmiotrace-ng: cannot write the trace to {where}: {exc.strerror}; "
          "tracing stopped, nothing left armed", file=sys.stderr)
    return EXIT_USAGE


def record(args: argparse.Namespace) -> int:
    """A record run; args from parse_tracing (checked there)."""
    args.raw, args.output = args.output, None
    args.record = True
    args.compat = args.pc = args.pid = args.histogram = args.irq = args.dma = False
    args.interval = None
    return trace(args)
