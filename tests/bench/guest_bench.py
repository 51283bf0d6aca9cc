#!/usr/bin/env python3
"""The guest half of tests/bench/run: time the edu exerciser's loop scenarios
untraced, under the kernel's mmiotrace and under mmiotrace-ng, and find each
tracer's largest loss-free burst.  Runs as root inside the test VM
(tests/vm/run --qemu '-device edu'); prints progress on stderr and, last, one
line ``BENCH-JSON {...}`` on stdout.  tests/bench/README.md explains the
numbers.

Every traced run is cut out of the tracer's stream by a trace_marker line
``bench-end-K`` written after it: both tracers print trace_marker writes as
MARK lines in stream order, so the records of run K are those after the
marker of run K-1 and before ``bench-end-K``.  The streams are never kept in
memory: a Counter counts record lines, Lost lines and markers as they go by.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NG = [str(REPO / "tests" / "vm" / "bin" / "mmiotrace-ng")]
EXERCISER_KO = REPO / "tests" / "drivers" / "edu_exerciser" / "edu_exerciser.ko"
RUN = Path("/sys/kernel/debug/edu_exerciser/run")
TRACING = Path("/sys/kernel/tracing")
MARKER = TRACING / "trace_marker"
EDU_ID = ("0x1234", "0x11e8")
WORK = Path("/tmp/bench")

# scenario -> COUNT of the timed runs (cloop: bytes, i.e. COUNT/4 accesses)
# (cloop stays below the ~32000 records the kernel's default buffer holds:
# one memcpy_toio never lets its trace_pipe reader run, see docs/analysis.md)
NS_COUNTS = {"rloop": 50_000, "wloop": 50_000, "cloop": 100_000}
QUICK_NS_COUNTS = {"rloop": 5_000, "wloop": 5_000, "cloop": 10_000}
REPEAT = 5
# warm-up of a mode: full-size runs of each scenario until two in a row agree
SETTLE_TOLERANCE = 0.15
SETTLE_MAX_RUNS = 8
# zero-loss search: scenario -> (first COUNT, largest COUNT tried)
BURSTS = {"rloop": (20_000, 5_120_000),      # 20000 * 2**8
          "cloop": (20_000, 0xFF000)}        # the exerciser's limit for cloop
BURST_MAX_S = 60.0            # no doubling past a run that took this long
BISECT_STEPS = 4
START_TIMEOUT = 600.0         # mmiotrace-ng start-up (bcc compiles under TCG)
STALL_TIMEOUT = 180.0         # no new stream data while waiting for a marker
MARK_RETRY_S = 5.0            # re-write a marker the tracer may have dropped


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def write_file(path: Path, value: str) -> None:
    """One write(2), as `echo` does; errors surface as OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def accesses(name: str, count: int) -> int:
    """MMIO accesses one run makes (records between MAP and UNMAP)."""
    if name == "cloop":   # rep movsl, then a movsw and a movsb tail
        return count // 4 + (1 if count & 2 else 0) + (count & 1)
    return count


# The helper's trap-only mode makes no access: rloop's check of what it
# reads fails (-EIO once the loop is done, a ratelimited line in dmesg).
wrong_values_expected = False


def run_scenario(name: str, count: int) -> int:
    """Run one exerciser scenario; return its duration in ns (the debugfs
    write returns when the scenario has finished)."""
    line = f"{name} {count}\n".encode()
    fd = os.open(RUN, os.O_WRONLY)
    try:
        t0 = time.perf_counter_ns()
        try:
            n = os.write(fd, line)
        except OSError as exc:
            if exc.errno != errno.EIO or not wrong_values_expected:
                raise
            n = len(line)
        t1 = time.perf_counter_ns()
    finally:
        os.close(fd)
    if n != len(line):
        raise OSError(errno.EIO, f"short write {n} for {line!r}")
    return t1 - t0


# -- counting records in a stream ---------------------------------------

_LOST = re.compile(rb"Lost (\d+) events|\[LOST (\d+) EVENTS\]")
_END = re.compile(rb"bench-end-(\d+)")


@dataclass
class Counts:
    r: int = 0
    w: int = 0
    unknown: int = 0
    maps: int = 0
    unmaps: int = 0
    lost_marks: int = 0     # N of "MARK 0.000000 Lost N events." (both tracers)
    lost_pipe: int = 0      # N of "CPU:c [LOST N EVENTS]" (trace_pipe)
    lost_lines: int = 0

    def minus(self, other: Counts) -> Counts:
        return Counts(*(a - b for a, b in zip(asdict(self).values(),
                                              asdict(other).values(), strict=True)))

    @property
    def access(self) -> int:
        return self.r + self.w + self.unknown

    @property
    def lost(self) -> int:
        # The kernel reports one overrun in both kinds of line.
        return max(self.lost_marks, self.lost_pipe)


class Counter:
    """Counts the lines of an mmiotrace stream fed in arbitrary chunks."""

    def __init__(self) -> None:
        self.c = Counts()
        self.ends: set[int] = set()
        self.bytes = 0
        self._tail = b""
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        buf = self._tail + data
        cut = buf.rfind(b"\n") + 1
        block, self._tail = buf[:cut], buf[cut:]
        if not block:
            return
        lines = b"\n" + block       # every line start now follows a "\n"
        with self._lock:
            c = self.c
            self.bytes += len(data)
            c.r += lines.count(b"\nR ")
            c.w += lines.count(b"\nW ")
            c.unknown += lines.count(b"\nUNKNOWN ")
            c.maps += lines.count(b"\nMAP ")
            c.unmaps += lines.count(b"\nUNMAP ")
            if b"Lost" in block or b"LOST" in block:
                for m in _LOST.finditer(block):
                    if m.group(1):
                        c.lost_marks += int(m.group(1))
                    else:
                        c.lost_pipe += int(m.group(2))
                    c.lost_lines += 1
            if b"bench-end-" in block:
                self.ends.update(int(m.group(1)) for m in _END.finditer(block))

    def snapshot(self) -> Counts:
        with self._lock:
            return Counts(**asdict(self.c))

    def seen_end(self, k: int) -> bool:
        with self._lock:
            return k in self.ends


# -- one measured run --------------------------------------------------

@dataclass
class Run:
    name: str
    count: int
    ns: int
    accesses: int
    recorded: int = -1      # access records seen (-1: untraced)
    maps: int = 0
    unmaps: int = 0
    lost: int = 0
    drain_s: float = 0.0    # from the end of the run to its end marker in the stream

    @property
    def complete(self) -> bool:
        """Every access recorded, MAP and UNMAP too, nothing reported lost."""
        return (self.recorded == self.accesses and self.maps == 1 and self.unmaps == 1
                and self.lost == 0)

    @property
    def ns_per_access(self) -> float:
        return self.ns / self.accesses

    def as_dict(self) -> dict:
        d = asdict(self)
        d["complete"] = self.complete if self.recorded >= 0 else None
        d["ns_per_access"] = round(self.ns_per_access, 1)
        return d


class Tracer:
    """What the kernel's tracer and mmiotrace-ng have in common: runs cut
    by end markers out of a stream counted by ``self.counter``."""

    label = "?"

    def __init__(self) -> None:
        self.counter = Counter()
        self.seq = 0

    def pump(self) -> None:
        """Feed new stream data to the counter (if no thread does)."""

    def alive(self) -> None:
        """Raise if the tracer died."""

    def run(self, name: str, count: int) -> Run:
        self.pump()
        before = self.counter.snapshot()
        self.seq += 1
        k = self.seq
        ns = self.scenario(name, count)
        t_end = time.monotonic()
        self._wait_end(k)
        drain = time.monotonic() - t_end
        d = self.counter.snapshot().minus(before)
        return Run(name, count, ns, accesses(name, count), d.access, d.maps, d.unmaps,
                   d.lost, round(drain, 2))

    def scenario(self, name: str, count: int) -> int:
        """One timed run of the scenario (ns)."""
        return run_scenario(name, count)

    def _wait_end(self, k: int) -> None:
        token = f"bench-end-{k}\n"
        write_file(MARKER, token)
        last_mark = last_data = time.monotonic()
        seen = self.counter.bytes
        while True:
            self.pump()
            if self.counter.seen_end(k):
                return
            now = time.monotonic()
            if self.counter.bytes != seen:
                seen, last_data = self.counter.bytes, now
            elif now - last_data > STALL_TIMEOUT:
                raise RuntimeError(f"{self.label}: marker {k} never appeared "
                                   f"(stream idle {STALL_TIMEOUT:.0f} s)")
            if now - last_mark > MARK_RETRY_S:
                write_file(MARKER, token)   # a full buffer may have dropped it
                last_mark = now
            self.alive()
            time.sleep(0.05)


# -- the kernel's own mmiotrace ------------------------------------------

def kernel_default_buffer_kb() -> int:
    """buffer_size_kb as the kernel sets it up: "7 (expanded: 1408)" reads
    as 1408, the size the buffer takes once a tracer is set."""
    text = (TRACING / "buffer_size_kb").read_text()
    m = re.search(r"expanded: (\d+)", text)
    return int(m.group(1) if m else text.split()[0])


class PipeReader(threading.Thread):
    """Drains trace_pipe into a Counter until stopped."""

    def __init__(self, counter: Counter) -> None:
        super().__init__(name="trace_pipe reader", daemon=True)
        self.counter = counter
        self.fd = os.open(TRACING / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    select.select([self.fd], [], [], 0.05)
                    continue
                if not chunk:
                    self.halt.wait(0.05)
                    continue
                self.counter.feed(chunk)
        except BaseException as exc:  # noqa: BLE001 (reported by stop() and alive())
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        if self.is_alive():
            raise RuntimeError("the trace_pipe reader did not stop")
        os.close(self.fd)


class KernelTracer(Tracer):
    """current_tracer=mmiotrace at the default buffer size, a trace_pipe
    reader running; stop() stops the reader BEFORE echo nop (else EBUSY)."""

    label = "kernel mmiotrace"

    def __init__(self, buffer_kb: int) -> None:
        super().__init__()
        self.buffer_kb = buffer_kb
        self.reader: PipeReader | None = None
        self.saved: dict[str, str] = {}

    def start(self) -> KernelTracer:
        current = (TRACING / "current_tracer").read_text().strip()
        if current != "nop":
            raise RuntimeError(f"current_tracer is {current!r}, not nop")
        for name in ("tracing_on", "buffer_size_kb"):
            self.saved[name] = (TRACING / name).read_text().split()[0]
        try:
            write_file(TRACING / "buffer_size_kb", str(self.buffer_kb))
            write_file(TRACING / "tracing_on", "1")
            write_file(TRACING / "current_tracer", "mmiotrace")
            self.reader = PipeReader(self.counter)
            self.reader.start()
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> None:
        if self.reader is not None and self.reader.error:
            raise RuntimeError(f"trace_pipe reader failed: {self.reader.error}")

    def stop(self) -> None:
        try:
            if self.reader is not None:
                self.reader.stop()
        finally:
            self.reader = None
            for attempt in range(100):
                try:
                    write_file(TRACING / "current_tracer", "nop")
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == 99:
                        raise
                    time.sleep(0.1)
            for name, value in self.saved.items():
                write_file(TRACING / name, value)
            self.saved.clear()


# -- mmiotrace-ng ---------------------------------------------------------

class NgTracer(Tracer):
    """One mmiotrace-ng process writing to a file in /tmp (tmpfs), which is
    read incrementally and emptied after each run (the writer's offset
    stays, so the file just becomes sparse)."""

    def __init__(self, bdf: str, extra: list[str], name: str) -> None:
        super().__init__()
        self.label = f"mmiotrace-ng {' '.join(extra) or '(default)'}".strip()
        WORK.mkdir(exist_ok=True)
        self.out = WORK / f"{name}.txt"
        self.errf = WORK / f"{name}.err"
        self.argv = [*NG, "--pci", bdf, "--verbose", *extra, "-o", str(self.out)]
        self.proc: subprocess.Popen | None = None
        self.fh = None
        self.startup_s = 0.0
        self.summary_lost: int | None = None
        self.exit_status: int | None = None
        # the tracer's process stopped (SIGSTOP) during each timed run: the
        # BPF programs and the helper work, nothing reads the ring buffer
        self.reader_stopped = False

    def start(self) -> NgTracer:
        with open(self.errf, "wb") as err:
            t0 = time.perf_counter()
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True)
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                if b"mmiotrace-ng: ready" in self.errf.read_bytes():
                    self.startup_s = time.perf_counter() - t0
                    break
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mmiotrace-ng exited {self.proc.returncode}: "
                                       + self.stderr())
                if time.monotonic() > deadline:
                    raise RuntimeError("mmiotrace-ng did not get ready in "
                                       f"{START_TIMEOUT:.0f} s: " + self.stderr())
                time.sleep(0.05)
            self.fh = open(self.out, "rb", buffering=0)   # closed in stop()
        except BaseException:
            self.stop()
            raise
        return self

    def phases(self) -> list[tuple[str, float]]:
        """The start-up phases --verbose printed: (name, seconds)."""
        return [(m.group(2), float(m.group(1))) for m in
                re.finditer(r"^mmiotrace-ng: +[\d.]+ s \(\+ *([\d.]+) s\) (.*)$",
                            self.stderr(), re.MULTILINE)]

    def stderr(self) -> str:
        return self.errf.read_text(errors="replace")

    def pump(self) -> None:
        if self.fh is None:
            return
        while chunk := self.fh.read(1 << 20):
            self.counter.feed(chunk)

    def alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"mmiotrace-ng exited {self.proc.returncode}: " + self.stderr())

    def scenario(self, name: str, count: int) -> int:
        if not self.reader_stopped or self.proc is None:
            return run_scenario(name, count)
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            return run_scenario(name, count)
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def run(self, name: str, count: int) -> Run:
        r = super().run(name, count)
        # Everything up to this run's marker is read: drop it from tmpfs.
        if self.fh is not None and os.path.getsize(self.out) == self.fh.tell():
            os.truncate(self.out, 0)
        return r

    def stop(self) -> None:
        """SIGINT (mmiotrace-ng drains and prints its summary), SIGKILL if
        it does not exit."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(180)
            except subprocess.TimeoutExpired:
                log(f"{self.label} did not exit on SIGINT: killing it")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None:
            self.exit_status = self.proc.returncode
        if self.fh is not None:
            self.pump()               # a final Lost line, if any
            self.fh.close()
            self.fh = None
        m = re.search(r"lost (\d+)", self.stderr()) if self.errf.exists() else None
        self.summary_lost = int(m.group(1)) if m else None


# -- the helper module alone (the cost breakdown) -------------------------

HELPER_KO = REPO / "kmod" / "mmiotng.ko"
# the helper's modes measured without the tracer (mmiotrace_ng.format.abi.Mode)
HELPER_MODES = {"ng_trap_only": "TRAP_ONLY", "ng_helper_emulate": "EMULATE",
                "ng_helper_singlestep": "SINGLESTEP"}
# trap-only skips each instruction: a rep movsl would be one trap in all
SINGLE_ACCESS_SCENARIOS = ("rloop", "wloop")


def load_helper() -> None:
    """The helper as the tracer loads it, with test_modes=1 (the trap-only
    mode of the breakdown); the tracer runs later use this module."""
    subprocess.run(["rmmod", "mmiotng"], capture_output=True, check=False)
    subprocess.run(["insmod", str(HELPER_KO), "test_modes=1"], check=True)


def edu_bar0(bdf: str) -> tuple[int, int]:
    start, end, _flags = (int(x, 16) for x in
                          Path(f"/sys/bus/pci/devices/{bdf}/resource").read_text().split()[:3])
    return start, end - start + 1


class HelperOnly:
    """The helper module traps edu's BAR0, driven over netlink as the
    tracer drives it, but with no BPF program attached: its tracepoints
    stay off.  Each mapping the exerciser makes is armed by the helper's
    ioremap probe.  ``mode`` is a mmiotrace_ng.format.abi.Mode name."""

    def __init__(self, bdf: str, mode: str) -> None:
        sys.path.insert(0, str(REPO))
        from mmiotrace_ng.format.abi import Mode
        from mmiotrace_ng.tracer.netlink import HelperSocket

        self.mode = Mode[mode]
        self.sock = HelperSocket()
        self.bar = edu_bar0(bdf)

    def __enter__(self) -> HelperOnly:
        global wrong_values_expected
        self.sock.filter_add(*self.bar)
        self.sock.set_mode(self.mode)
        wrong_values_expected = self.mode.name == "TRAP_ONLY"
        self.start = self.sock.status()
        return self

    def faults(self) -> int:
        return self.sock.status().faults - self.start.faults

    def __exit__(self, *exc: object) -> None:
        global wrong_values_expected
        wrong_values_expected = False
        try:
            from mmiotrace_ng.format.abi import Mode

            self.sock.set_mode(Mode.EMULATE)
            self.sock.disarm_all()
        finally:
            self.sock.close()


def helper_breakdown(res: dict, bdf: str, counts: dict[str, int]) -> None:
    """ns per access of the helper alone in each of HELPER_MODES, and the
    faults it took per access (1: every access trapped)."""
    load_helper()
    for key, mode in HELPER_MODES.items():
        sel = ({k: v for k, v in counts.items() if k in SINGLE_ACCESS_SCENARIOS}
               if mode == "TRAP_ONLY" else counts)
        log(f"{key}: the helper alone, mode {mode}, no BPF program")
        with HelperOnly(bdf, mode) as h:
            warm_up(None, sel)
            before = h.faults()
            res[key] = time_scenarios(None, sel, key)
            made = sum(v["accesses"] * REPEAT for v in res[key].values())
            res[key + "_faults_per_access"] = round((h.faults() - before) / made, 4)
        log(f"{key}: {res[key + '_faults_per_access']} faults per access")


# -- measurements ---------------------------------------------------------

def time_scenarios(tracer: Tracer | None, counts: dict[str, int], label: str) -> dict:
    """REPEAT runs of each loop scenario; the median ns per access."""
    out = {}
    run = tracer.run if tracer else (lambda n, c: Run(n, c, run_scenario(n, c), accesses(n, c)))
    for name, count in counts.items():
        runs = []
        for i in range(REPEAT):
            r = run(name, count)
            runs.append(r)
            log(f"{label}: {name} {count}: {r.ns_per_access:.0f} ns/access"
                + ("" if r.recorded < 0 else
                   f", {r.recorded}/{r.accesses} recorded, lost {r.lost}, "
                   f"drained in {r.drain_s:.1f} s") + f" ({i + 1}/{REPEAT})")
            if r.recorded >= 0 and not r.complete:
                log(f"{label}: WARNING: run not completely recorded: {r.as_dict()}")
        out[name] = {
            "count": count,
            "accesses": runs[0].accesses,
            "ns_per_access": round(statistics.median(r.ns_per_access for r in runs), 1),
            "runs": [r.as_dict() for r in runs],
        }
    return out


def warm_up(tracer: Tracer | None, counts: dict[str, int]) -> None:
    """Runs of each scenario, not measured, until two in a row agree within
    SETTLE_TOLERANCE (at most SETTLE_MAX_RUNS): they fill QEMU's translation
    cache and let the system settle after a tracer started (the first
    seconds of a tracer are slower, by up to 2x)."""
    for name, count in counts.items():
        last, runs = None, 0
        while runs < SETTLE_MAX_RUNS:
            ns = tracer.run(name, count).ns if tracer else run_scenario(name, count)
            runs += 1
            if last is not None and abs(ns - last) <= SETTLE_TOLERANCE * last:
                break
            last = ns
        log(f"warm-up: {name} {count}: {runs} runs")


def fixed_cost(tracer: Tracer | None, label: str) -> dict:
    """The cost of a run apart from its loop: ``rloop 1`` (pci_iomap of
    BAR0, one readl, pci_iounmap), median of REPEAT runs, in ns."""
    runs = [tracer.run("rloop", 1) if tracer else Run("rloop", 1, run_scenario("rloop", 1), 1)
            for _ in range(REPEAT)]
    ns = statistics.median(r.ns for r in runs)
    log(f"{label}: rloop 1 (map, 1 read, unmap): {ns / 1000:.0f} us")
    return {"ns": ns, "runs": [r.as_dict() for r in runs]}


@dataclass
class Search:
    """Largest rloop COUNT recorded with no loss: doubling, then bisection."""

    best: Run | None = None
    first_loss: Run | None = None
    capped: bool = False
    runs: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        b = self.best
        return {
            "max_n": b.count if b else 0,
            "max_accesses": b.accesses if b else 0,
            "accesses_per_s": round(b.accesses / (b.ns / 1e9)) if b else 0,
            "capped": self.capped,
            "first_loss_n": self.first_loss.count if self.first_loss else None,
            "first_loss_missing": (self.first_loss.accesses - self.first_loss.recorded
                                   if self.first_loss else None),
            "first_loss_reported": self.first_loss.lost if self.first_loss else None,
            "runs": self.runs,
        }


def zero_loss_search(tracer: Tracer, label: str, name: str, start: int, cap: int) -> Search:
    """Largest COUNT of scenario ``name`` recorded with no loss."""
    s = Search()

    def attempt(n: int) -> Run:
        r = tracer.run(name, n)
        s.runs.append(r.as_dict())
        log(f"{label}: burst {name} {n}: {'no loss' if r.complete else 'LOSS'} "
            f"({r.recorded}/{r.accesses} recorded, {r.lost} reported lost), "
            f"{r.accesses / (r.ns / 1e9):.0f} accesses/s, drained in {r.drain_s:.1f} s")
        if r.complete:
            if s.best is None or n > s.best.count:
                s.best = r
        elif s.first_loss is None or n < s.first_loss.count:
            s.first_loss = r
        return r

    n = start
    while True:
        r = attempt(n)
        if not r.complete:
            break
        if n >= cap or r.ns / 1e9 >= BURST_MAX_S:
            s.capped = True
            return s
        n = min(2 * n, cap)
    lo = s.best.count if s.best else 0
    hi = n
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) // 2
        if mid <= lo or mid <= 0:
            break
        if attempt(mid).complete:
            lo = mid
        else:
            hi = mid
    return s


# -- set-up ---------------------------------------------------------------

def find_edu() -> str:
    for dev in sorted(Path("/sys/bus/pci/devices").iterdir()):
        try:
            ids = ((dev / "vendor").read_text().strip(), (dev / "device").read_text().strip())
        except OSError:
            continue
        if ids == EDU_ID:
            return dev.name
    raise RuntimeError("no edu PCI device (1234:11e8): boot with --qemu '-device edu'")


def load_exerciser() -> None:
    if not EXERCISER_KO.exists():
        raise RuntimeError(f"{EXERCISER_KO} is missing: run tests/setup.sh --no-apt on the host")
    if Path("/sys/module/edu_exerciser").exists():
        subprocess.run(["rmmod", "edu_exerciser"], check=True)
    subprocess.run(["insmod", str(EXERCISER_KO)], check=True)
    if not RUN.exists():
        raise RuntimeError(f"edu_exerciser loaded but {RUN} is missing")


BAD_KERNEL_LOG = re.compile(r"Oops|BUG|WARNING|general protection|Call Trace")


def kernel_log_problems() -> list[str]:
    out = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if BAD_KERNEL_LOG.search(line)]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small counts, short search (checks the harness, numbers are noisy)")
    ap.add_argument("--only", metavar="PARTS",
                    help="measure only these (comma-separated: kernel, helper, ng, or user: "
                         "a process's read through its own mapping against the kernel "
                         "driver's, traced and not; or "
                         "ng-emulate: ng's default mode timed, no search, no --singlestep; "
                         "ng-flight: ng's default mode and --flight, sessions in turn "
                         "(--flight-rounds; boot with memmap=2M$0x60000000); "
                         "experiments: the output is not what tests/bench/run reads)")
    ap.add_argument("--flight-rounds", type=int, default=FLIGHT_ROUNDS, metavar="N",
                    help=f"ng-flight: rounds of a plain and a --flight session "
                         f"(default {FLIGHT_ROUNDS})")
    args = ap.parse_args()
    if os.environ.get("NGVM_GUEST") != "1":
        log("WARNING: not in the test VM (NGVM_GUEST unset); this traces the real machine")
    counts = QUICK_NS_COUNTS if args.quick else NS_COUNTS
    bursts = {name: (start, 4 * start if args.quick else cap)
              for name, (start, cap) in BURSTS.items()}
    t_all = time.monotonic()
    load_exerciser()
    bdf = find_edu()
    buffer_kb = kernel_default_buffer_kb()
    res: dict = {
        "guest": {"kernel": os.uname().release, "cpus": os.cpu_count(),
                  "cpu_model": cpu_model(), "edu": bdf,
                  "kernel_buffer_size_kb": buffer_kb, "quick": args.quick},
        "ns_counts": counts, "repeat": REPEAT,
        "bursts": {name: {"start": start, "cap": cap} for name, (start, cap) in bursts.items()},
        "burst_max_run_s": BURST_MAX_S, "bisect_steps": BISECT_STEPS,
    }
    problems_before = len(kernel_log_problems())
    try:
        measure(res, bdf, counts, bursts, buffer_kb,
                set(args.only.split(",")) if args.only else {"kernel", "helper", "ng"},
                args.flight_rounds)
    except BaseException as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        problems = kernel_log_problems()[problems_before:]
        if problems:
            log("kernel log problems:\n" + "\n".join(problems))
        res["kernel_log_problems"] = problems
        res["guest_seconds"] = round(time.monotonic() - t_all, 1)
        subprocess.run(["rmmod", "edu_exerciser"], check=False)
        print("BENCH-JSON " + json.dumps(res), flush=True)
    return 0


def measure(res: dict, bdf: str, counts: dict[str, int],
            bursts: dict[str, tuple[int, int]], buffer_kb: int, parts: set[str],
            flight_rounds: int) -> None:
    """All the guest measurements (those of parts), into res."""
    res["zero_loss"] = {}
    warm_up(None, counts)
    log("untraced")
    res["untraced"] = time_scenarios(None, counts, "untraced")
    res["fixed_cost"] = {"untraced": fixed_cost(None, "untraced")}
    if "kernel" in parts:
        kernel_tracer(res, counts, bursts, buffer_kb)
    if "helper" in parts:
        helper_breakdown(res, bdf, counts)
    if "ng" in parts:
        ng_tracer(res, bdf, counts, bursts)
    elif "ng-emulate" in parts:
        ng_tracer(res, bdf, counts, {}, modes=(("ng_emulate", []),))
    if "ng-flight" in parts:
        flight_ab(res, bdf, counts, flight_rounds)
    if "user" in parts:
        user_access_cost(res, bdf, counts["rloop"])


# -- a process's accesses through its own mapping of the BAR --------------

USER_PROGRAM = REPO / "tests" / "drivers" / "user_mmio" / "user_mmio"


def user_reads(bdf: str, n: int) -> float:
    """ns per read of user_mmio's timed loop of n reads of BAR0's
    identification through the sysfs resource0 mapping."""
    out = subprocess.run([str(USER_PROGRAM), f"/sys/bus/pci/devices/{bdf}/resource0",
                          "count", str(n)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"^COUNT (\d+) (\d+)$", out, re.MULTILINE)
    if not m:
        raise RuntimeError(f"user_mmio: {out!r}")
    return int(m[2]) / int(m[1])


def user_access_cost(res: dict, bdf: str, n: int) -> None:
    """What tracing adds to one read: of the kernel driver (the exerciser's
    rloop) and of a process (user_mmio's reads through resource0, the
    exerciser unloaded: a driver's claim refuses that mapping), each
    REPEAT times untraced, then REPEAT times under one mmiotrace-ng
    session (the tracer reading as it goes), medians; the same boot, one
    after the other."""
    if not USER_PROGRAM.exists():
        raise RuntimeError(f"{USER_PROGRAM} is missing: run tests/setup.sh --no-apt on the host")
    out: dict = {"reads": n, "repeat": REPEAT}

    def side(name: str, read: Callable[[], float]) -> None:
        read()          # warm: QEMU's translations, the caches
        untraced = statistics.median(read() for _ in range(REPEAT))
        ng = NgTracer(bdf, [], f"user-cost-{name}").start()
        try:
            read()
            traced = statistics.median(read() for _ in range(REPEAT))
        finally:
            ng.stop()
        out[name] = {"untraced_ns": round(untraced, 1), "traced_ns": round(traced, 1),
                     "cost_ns": round(traced - untraced, 1)}
        log(f"user cost: {name}: {untraced:.0f} ns untraced, {traced:.0f} ns traced per read")

    load_exerciser()
    side("kernel", lambda: run_scenario("rloop", n) / n)
    subprocess.run(["rmmod", "edu_exerciser"], check=True)
    side("user", lambda: user_reads(bdf, n))
    out["user_over_kernel"] = round(out["user"]["cost_ns"] / out["kernel"]["cost_ns"], 3)
    log(f"user cost: a process's traced read costs {out['user_over_kernel']}x the kernel "
        f"driver's")
    res["user_access"] = out


# --flight against plain tracing: sessions in turn, ABBA order
FLIGHT_ROUNDS = 6
FLIGHT_MODES = (("ng_plain", []), ("ng_flight", ["--flight"]))


def flight_ab(res: dict, bdf: str, counts: dict[str, int], rounds: int) -> None:
    """The flight recorder's cost: ROUNDS rounds of one plain session and
    one --flight session (the order swapped every round: plain, flight,
    flight, plain, ...), each warmed up and timed like the other modes.
    A round's ratio is its flight session's median over its plain one's;
    the median of the rounds' ratios is the answer, and their spread shows
    what the host resolves.  Needs memmap=2M$0x60000000 on the guest's
    command line."""
    sessions: dict[str, list[dict]] = {mode: [] for mode, _ in FLIGHT_MODES}
    for k in range(rounds):
        order = FLIGHT_MODES if k % 2 == 0 else FLIGHT_MODES[::-1]
        for mode, extra in order:
            log(f"round {k + 1}/{rounds}: {mode}")
            part: dict = {"fixed_cost": {}}
            ng_tracer(part, bdf, counts, {}, modes=((mode, extra),))
            sessions[mode].append(part[mode])
    ratios = {name: [round(f[name]["ns_per_access"] / p[name]["ns_per_access"], 3)
                     for p, f in zip(sessions["ng_plain"], sessions["ng_flight"], strict=True)]
              for name in counts}
    res["flight_ab"] = {
        "rounds": rounds,
        "sessions": sessions,
        "round_ratios": ratios,
        "ns_per_access": {mode: {name: round(statistics.median(
            s[name]["ns_per_access"] for s in sessions[mode]), 1) for name in counts}
            for mode in sessions},
    }
    res["flight_ratio"] = {name: round(statistics.median(r), 3) for name, r in ratios.items()}
    for name, r in ratios.items():
        log(f"--flight / plain, {name}: median {res['flight_ratio'][name]} "
            f"of {rounds} rounds ({min(r)}..{max(r)})")
    helper_flight_ab(res, bdf, {k: v for k, v in counts.items() if k in ("rloop", "wloop")},
                     2 * rounds)


def helper_flight_ab(res: dict, bdf: str, counts: dict[str, int], rounds: int) -> None:
    """What the flight record adds to an access, where the noise of whole
    tracer sessions cannot hide it: the helper alone (emulate mode, no BPF
    program, no reader), sessions with and without FLIGHT_START in turn
    (ABBA), the loops on one CPU.  Its clock read is counted too (with
    --flight the helper stamps the access; plain, the BPF program does).
    The increment is then set against the whole path's ns per access of
    the plain sessions."""
    sys.path.insert(0, str(REPO))
    from mmiotrace_ng.tracer import flight

    where = flight.region(None, Path("/proc/cmdline").read_text())
    load_helper()
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(before)})
    times: dict[bool, list[dict]] = {False: [], True: []}
    try:
        for k in range(rounds):
            for on in ((False, True) if k % 2 == 0 else (True, False)):
                with HelperOnly(bdf, "EMULATE") as h:
                    if on:
                        h.sock.flight_start(where.addr, where.size, 4096, "VERSION 20070824\n")
                    label = f"helper {'--flight' if on else 'plain'} {k + 1}/{rounds}"
                    warm_up(None, counts)
                    times[on].append(time_scenarios(None, counts, label))
    finally:
        os.sched_setaffinity(0, before)
    added = {name: [round(f[name]["ns_per_access"] - p[name]["ns_per_access"], 1)
                    for p, f in zip(times[False], times[True], strict=True)]
             for name in counts}
    whole = res["flight_ab"]["ns_per_access"]["ng_plain"]
    res["flight_helper_ab"] = {
        "rounds": rounds, "plain": times[False], "flight": times[True],
        "added_ns": added,
        "added_ns_median": {name: statistics.median(a) for name, a in added.items()},
        "added_of_whole_path": {name: round(statistics.median(a) / whole[name], 3)
                                for name, a in added.items()},
    }
    for name, a in added.items():
        log(f"helper alone, --flight adds to {name}: median {statistics.median(a):.0f} ns "
            f"of {rounds} rounds ({min(a):.0f}..{max(a):.0f}), "
            f"{res['flight_helper_ab']['added_of_whole_path'][name]:.1%} of the whole "
            f"path's {whole[name]:.0f} ns")


def kernel_tracer(res: dict, counts: dict[str, int],
                  bursts: dict[str, tuple[int, int]], buffer_kb: int) -> None:
    log(f"kernel mmiotrace (buffer_size_kb {buffer_kb})")
    kt = KernelTracer(buffer_kb).start()
    try:
        warm_up(kt, counts)
        res["kernel_mmiotrace"] = time_scenarios(kt, counts, "kernel")
        res["fixed_cost"]["kernel_mmiotrace"] = fixed_cost(kt, "kernel")
        res["zero_loss"]["kernel_mmiotrace"] = {
            name: zero_loss_search(kt, "kernel", name, *bursts[name]).as_dict()
            for name in bursts}
    finally:
        kt.stop()


NG_MODES = (("ng_emulate", []), ("ng_singlestep", ["--singlestep"]))


def ng_tracer(res: dict, bdf: str, counts: dict[str, int],
              bursts: dict[str, tuple[int, int]],
              modes: tuple[tuple[str, list[str]], ...] = NG_MODES) -> None:
    for mode, extra in modes:
        log(f"{mode}: starting mmiotrace-ng {' '.join(extra)}")
        ng = NgTracer(bdf, extra, mode).start()
        try:
            log(f"{mode}: ready after {ng.startup_s:.1f} s")
            warm_up(ng, counts)
            res[mode] = time_scenarios(ng, counts, mode)
            if mode == "ng_emulate":
                # the records of a run fit the ring (16 MiB): none lost
                single = {k: v for k, v in counts.items() if k in SINGLE_ACCESS_SCENARIOS}
                ng.reader_stopped = True
                try:
                    res["ng_emulate_reader_stopped"] = time_scenarios(
                        ng, single, "ng_emulate_reader_stopped")
                finally:
                    ng.reader_stopped = False
            res["fixed_cost"][mode] = fixed_cost(ng, mode)
            if mode == "ng_emulate":
                res["zero_loss"]["ng"] = {
                    name: zero_loss_search(ng, mode, name, *bursts[name]).as_dict()
                    for name in bursts}
        finally:
            ng.stop()
        res[mode + "_process"] = {"startup_s": round(ng.startup_s, 2),
                                  "startup_phases": ng.phases(),
                                  "exit_status": ng.exit_status,
                                  "summary_lost": ng.summary_lost,
                                  "stderr_tail": ng.stderr()[-500:]}
        log(f"{mode}: stopped, exit {ng.exit_status}, lost {ng.summary_lost} in all")


if __name__ == "__main__":
    sys.exit(main())
