"""Capture the kernel's own mmiotrace in the running guest, and normalize it.

Capturing (root, inside the test VM)::

    with KernelMmiotrace() as kt:          # echo mmiotrace > current_tracer
        do_something()                     # e.g. run an exerciser scenario
        kt.wait(until=lambda text: ...)    # optional: wait for a record
    text = kt.text                         # reader stopped, tracer back on nop

or in one call: ``text = capture(trigger, until=...)``.

Enabling mmiotrace offlines every CPU but one; switching back to ``nop``
brings them back.  ``echo nop`` fails with EBUSY while a reader holds
trace_pipe open, so the reader is always stopped first.  The reader is a
thread polling trace_pipe with O_NONBLOCK: a capture is quiescent when
trace_pipe has been empty for ``quiet`` seconds (and ``until`` holds).

Normalizing: ``normalize(text)`` drops timestamps and replaces virtual
addresses and map ids by their order of appearance, so two streams can be
compared line by line; ``to_records(text, base)`` turns a stream into the
tuples of tests/drivers/edu_exerciser/scenarios.py.
"""

from __future__ import annotations

import errno
import os
import re
import select
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

TRACING = Path("/sys/kernel/tracing")
# ~64 bytes of ring buffer per record; 20000 records fit several times over.
BUFFER_SIZE_KB = 8192

Until = Callable[[str], bool] | str | None


class TraceTimeoutError(AssertionError):
    """The capture did not become quiescent (or ``until`` never held)."""

    def __init__(self, msg: str, text: str):
        super().__init__(msg)
        self.text = text


def _write(path: Path, value: str) -> None:
    # One write(2) per value, as `echo` does; errors surface as OSError.
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _until_pred(until: Until) -> Callable[[str], bool]:
    if until is None:
        return lambda _text: True
    if isinstance(until, str):
        return lambda text: any(line.startswith(until) for line in text.splitlines())
    return until


class _PipeReader(threading.Thread):
    """Drains trace_pipe into memory (and optionally a file) until stopped."""

    def __init__(self, path: Path, copy_to: Path | None):
        super().__init__(name="trace_pipe reader", daemon=True)
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._copy = copy_to.open("wb") if copy_to else None  # closed in stop()
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.last_data = time.monotonic()
        self.empty = False          # the last read found trace_pipe empty
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:
                    self.empty = True
                    select.select([self._fd], [], [], 0.05)
                    continue
                if not chunk:       # EOF: tracing switched off under us
                    self.empty = True
                    self._halt.wait(0.05)
                    continue
                self.empty = False
                self.last_data = time.monotonic()
                with self._lock:
                    self._chunks.append(chunk)
                if self._copy:
                    self._copy.write(chunk)
                    self._copy.flush()
        except BaseException as exc:  # noqa: BLE001 (re-raised by stop())
            self.error = exc

    def data(self) -> bytes:
        """The stream's bytes so far, exactly as trace_pipe gave them."""
        with self._lock:
            return b"".join(self._chunks)

    def text(self) -> str:
        return self.data().decode(errors="replace")

    def stop(self) -> str:
        self._halt.set()
        self.join(10)
        if self.is_alive():
            raise RuntimeError("trace_pipe reader did not stop")
        os.close(self._fd)
        if self._copy:
            self._copy.close()
        if self.error:
            raise self.error
        return self.text()


class KernelMmiotrace:
    """Context manager running the kernel's mmiotrace tracer for its body.

    On exit it waits until the output is quiescent (see ``wait``), stops the
    reader, switches the tracer back to ``nop`` and restores tracing_on and
    buffer_size_kb.  The captured stream is then in ``self.text``.
    """

    def __init__(self, *, quiet: float = 0.3, timeout: float = 60.0,
                 copy_to: Path | None = None, buffer_size_kb: int = BUFFER_SIZE_KB):
        self.quiet = quiet
        self.timeout = timeout
        self.copy_to = copy_to
        self.buffer_size_kb = buffer_size_kb
        self.text = ""
        self.data = b""             # the same stream, as bytes
        self._reader: _PipeReader | None = None
        self._saved: dict[str, str] = {}

    # -- lifecycle -------------------------------------------------------
    def start(self) -> Self:
        current = (TRACING / "current_tracer").read_text().strip()
        if current != "nop":
            raise RuntimeError(f"current_tracer is {current!r}, not nop: another tracer runs")
        for name in ("tracing_on", "buffer_size_kb"):
            # buffer_size_kb reads e.g. "7 (expanded: 1408)": keep the number.
            self._saved[name] = (TRACING / name).read_text().split()[0]
        _write(TRACING / "buffer_size_kb", str(self.buffer_size_kb))
        _write(TRACING / "tracing_on", "1")
        _write(TRACING / "current_tracer", "mmiotrace")
        try:
            self._reader = _PipeReader(TRACING / "trace_pipe", self.copy_to)
            self._reader.start()
        except BaseException:
            self._disable()
            raise
        return self

    def wait(self, until: Until = None, *, quiet: float | None = None,
             timeout: float | None = None) -> str:
        """Wait until ``until`` holds on the text so far and trace_pipe has
        been empty for ``quiet`` seconds; return the text so far."""
        assert self._reader is not None, "not started"
        pred = _until_pred(until)
        quiet = self.quiet if quiet is None else quiet
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            text = self._reader.text()
            idle = time.monotonic() - self._reader.last_data
            if self._reader.empty and idle >= quiet and pred(text):
                return text
            if self._reader.error:
                raise self._reader.error
            if time.monotonic() > deadline:
                raise TraceTimeoutError(
                    f"kernel mmiotrace not quiescent after {timeout or self.timeout:.0f} s "
                    f"(until satisfied: {pred(text)}, idle {idle:.1f} s)", text)
            time.sleep(0.05)

    def stop(self) -> str:
        """Stop the reader first, then echo nop; return the captured text."""
        try:
            if self._reader is not None:
                self.text = self._reader.stop()
                self.data = self._reader.data()
        finally:
            self._reader = None
            self._disable()
        return self.text

    def _disable(self) -> None:
        # EBUSY here would mean someone else holds trace_pipe open.
        for attempt in range(50):
            try:
                _write(TRACING / "current_tracer", "nop")
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or attempt == 49:
                    raise
                time.sleep(0.1)
        for name, value in self._saved.items():
            _write(TRACING / name, value)
        self._saved.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.wait()
        finally:
            self.stop()


def capture(trigger: Callable[[], object], until: Until = None, *,
            quiet: float = 0.3, timeout: float = 60.0,
            copy_to: Path | None = None) -> str:
    """Run ``trigger`` under the kernel's mmiotrace and return the stream.

    ``until``: a predicate on the text, or a line prefix (e.g. "UNMAP"), that
    must hold before the capture is considered complete."""
    kt = KernelMmiotrace(quiet=quiet, timeout=timeout, copy_to=copy_to)
    kt.start()
    try:
        trigger()
        kt.wait(until)
    finally:
        kt.stop()
    return kt.text


# -- PCI devices (for phys relative to a BAR) ----------------------------

@dataclass(frozen=True)
class PciDevice:
    name: str                            # e.g. "0000:00:02.0"
    bars: tuple[tuple[int, int], ...]    # (start, length) of resources 0..5
    driver: str | None


def find_pci_devices(vendor: int, device: int,
                     root: Path = Path("/sys/bus/pci/devices")) -> list[PciDevice]:
    """Every PCI device with these ids, its BARs read from sysfs."""
    found = []
    for path in sorted(root.iterdir()):
        try:
            ven = int((path / "vendor").read_text(), 16)
            dev = int((path / "device").read_text(), 16)
        except OSError:
            continue
        if (ven, dev) != (vendor, device):
            continue
        bars = []
        for line in (path / "resource").read_text().splitlines()[:6]:
            start, end, _flags = (int(x, 16) for x in line.split())
            bars.append((start, end - start + 1 if end > start else 0))
        drv = path / "driver"
        found.append(PciDevice(path.name, tuple(bars),
                               os.path.basename(os.readlink(drv)) if drv.exists() else None))
    return found


def find_pci_device(vendor: int, device: int,
                    root: Path = Path("/sys/bus/pci/devices")) -> PciDevice | None:
    """The first PCI device with these ids."""
    found = find_pci_devices(vendor, device, root)
    return found[0] if found else None


# -- parsing -------------------------------------------------------------

_RW = re.compile(r"^(R|W) (\d+) (\d+\.\d{6}) (-?\d+) (0x[0-9a-f]+) (0x[0-9a-f]+) "
                 r"(0x[0-9a-f]+) (\d+)$")
_UNKNOWN = re.compile(r"^UNKNOWN (\d+\.\d{6}) (-?\d+) (0x[0-9a-f]+) "
                      r"([0-9a-f]{2}),([0-9a-f]{2}),([0-9a-f]{2}) (0x[0-9a-f]+) (\d+)$")
_MAP = re.compile(r"^MAP (\d+\.\d{6}) (-?\d+) (0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+) "
                  r"(0x[0-9a-f]+) (\d+)$")
_UNMAP = re.compile(r"^UNMAP (\d+\.\d{6}) (-?\d+) (0x[0-9a-f]+) (\d+)$")
_LOST = re.compile(r"^MARK 0\.000000 Lost (\d+) events\.$")
_MARK = re.compile(r"^MARK (\d+\.\d{6}) (.*)$")
_PIPE_LOST = re.compile(r"^CPU:(\d+) \[LOST (\d+) EVENTS\]$")


class _Ids:
    """Replaces values by 1, 2, ... in order of first appearance."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, value: str) -> int:
        return self.seen.setdefault(value, len(self.seen) + 1)


def normalize(text: str) -> list[str]:
    """Normalize a stream line by line.

    Timestamps become ``T``; map ids become ``M<n>`` and virtual addresses
    ``V<n>`` by order of appearance (``M-1`` stays for an unknown mapping);
    everything else (phys, values, widths, pc, pid, PCIDEV lines) is kept.
    Lines that are not records (blank, ``#`` comments) are dropped.
    """
    maps, virts = _Ids(), _Ids()

    def mid(value: str) -> str:
        return "M-1" if value == "-1" else f"M{maps(value)}"

    out: list[str] = []
    for line in text.splitlines():
        line = line.rstrip("\n")
        if not line.strip() or line.startswith("#"):
            continue
        if m := _RW.match(line):
            op, width, _t, map_id, phys, value, pc, pid = m.groups()
            out.append(f"{op} {width} T {mid(map_id)} {phys} {value} {pc} {pid}")
        elif m := _UNKNOWN.match(line):
            _t, map_id, phys, b0, b1, b2, pc, pid = m.groups()
            out.append(f"UNKNOWN T {mid(map_id)} {phys} {b0},{b1},{b2} {pc} {pid}")
        elif m := _MAP.match(line):
            _t, map_id, phys, virt, length, pc, pid = m.groups()
            out.append(f"MAP T {mid(map_id)} {phys} V{virts(virt)} {length} {pc} {pid}")
        elif m := _UNMAP.match(line):
            _t, map_id, pc, pid = m.groups()
            out.append(f"UNMAP T {mid(map_id)} {pc} {pid}")
        elif _LOST.match(line):
            out.append(line)
        elif m := _MARK.match(line):
            out.append(f"MARK T {m.group(2)}")
        else:
            out.append(line)
    return out


def to_records(text: str, base: int = 0, *, with_headers: bool = False,
               with_marks: bool = False) -> list[tuple]:
    """Turn a stream into scenarios.py tuples, phys made relative to ``base``:

    ("MAP", offset, length) ("UNMAP",) ("R", width, offset, value)
    ("W", width, offset, value) ("UNKNOWN", offset, (b0, b1, b2))
    ("LOST", n) always; ("MARK", text) with ``with_marks``;
    ("VERSION", v) and ("PCIDEV", line) with ``with_headers``.
    Anything else becomes ("?", line), so that it shows up in a comparison.
    """
    out: list[tuple] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if m := _RW.match(line):
            op, width, _t, _mid, phys, value, _pc, _pid = m.groups()
            out.append((op, int(width), int(phys, 16) - base, int(value, 16)))
        elif m := _UNKNOWN.match(line):
            _t, _mid, phys, b0, b1, b2, _pc, _pid = m.groups()
            out.append(("UNKNOWN", int(phys, 16) - base,
                        (int(b0, 16), int(b1, 16), int(b2, 16))))
        elif m := _MAP.match(line):
            _t, _mid, phys, _virt, length, _pc, _pid = m.groups()
            out.append(("MAP", int(phys, 16) - base, int(length, 16)))
        elif _UNMAP.match(line):
            out.append(("UNMAP",))
        elif m := _LOST.match(line):
            out.append(("LOST", int(m.group(1))))
        elif m := _PIPE_LOST.match(line):
            out.append(("LOST", int(m.group(2))))
        elif m := _MARK.match(line):
            if with_marks:
                out.append(("MARK", m.group(2)))
        elif line.startswith("VERSION "):
            if with_headers:
                out.append(("VERSION", line.split()[1]))
        elif line.startswith("PCIDEV "):
            if with_headers:
                out.append(("PCIDEV", line))
        else:
            out.append(("?", line))
    return out


def device_stream(text: str, bars: list[tuple[int, int]]) -> list[tuple]:
    """Every record of one device's mappings, in order, for comparing two
    tracers record for record: MAP (offset into the BAR it maps, length),
    R/W (width, (BAR, offset), value, pc), UNKNOWN and UNMAP of those
    mappings (found by map id), every MARK and LOST, and ("?", line) for a
    line that parses as nothing.  Repeated reads count one by one: QEMU's
    devices answer a poll at once, so a load repeats a read as often under
    either tracer, and a tracer that dropped or doubled one must fail.
    Records of other mappings (the kernel's tracer maps every ioremap) are
    left out."""
    def bar_of(phys: int) -> tuple[int, int] | None:
        return next(((i, phys - s) for i, (s, n) in enumerate(bars) if s <= phys < s + n),
                    None)

    ours: set[str] = set()
    out: list[tuple] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        rec: tuple | None
        if m := _MAP.match(line):
            where = bar_of(int(m.group(3), 16))
            rec = None
            if where is not None:
                ours.add(m.group(2))
                rec = ("MAP", *where, int(m.group(5), 16))
        elif m := _RW.match(line):
            op, width, _t, mid, phys, value, pc, _pid = m.groups()
            rec = ((op, int(width), bar_of(int(phys, 16)), int(value, 16), int(pc, 16))
                   if mid in ours else None)
        elif m := _UNKNOWN.match(line):
            _t, mid, phys, b0, b1, b2, _pc, _pid = m.groups()
            rec = ("UNKNOWN", bar_of(int(phys, 16)), b0, b1, b2) if mid in ours else None
        elif m := _UNMAP.match(line):
            rec = ("UNMAP",) if m.group(2) in ours else None
            ours.discard(m.group(2))
        elif m := _LOST.match(line):
            rec = ("LOST", int(m.group(1)))
        elif m := _PIPE_LOST.match(line):
            rec = ("LOST", int(m.group(2)))
        elif m := _MARK.match(line):
            rec = ("MARK", m.group(2))
        elif line.startswith(("VERSION ", "PCIDEV ")):
            rec = None
        else:
            rec = ("?", line)
        if rec is not None:
            out.append(rec)
    return out


def repeated_reads(recs: list[tuple]) -> list[int]:
    """Indexes of the reads that repeat the record before them exactly (for
    showing that a comparison counts them: drop one and it must fail)."""
    return [i for i in range(1, len(recs)) if recs[i][0] == "R" and recs[i] == recs[i - 1]]


def between(text: str, begin: str, end: str) -> str:
    """The lines between the MARK lines that contain begin and end."""
    lines = text.splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if ln.startswith("MARK ") and begin in ln)
    last = next(i for i, ln in enumerate(lines) if ln.startswith("MARK ") and end in ln)
    return "".join(lines[first + 1:last])


def assert_same(ours: list, kernel: list) -> None:
    """Two record lists equal, or an error showing the first difference."""
    if ours == kernel:
        return
    i = next((i for i, (a, b) in enumerate(zip(ours, kernel, strict=False)) if a != b),
             min(len(ours), len(kernel)))
    raise AssertionError(f"record {i} differs (ours {len(ours)}, kernel's {len(kernel)}):\n"
                         f"ours:   {ours[max(0, i - 3):i + 3]}\n"
                         f"kernel: {kernel[max(0, i - 3):i + 3]}")


def prepared_e1000_load(begin: str, end: str, also=None) -> None:
    """modprobe e1000 between two markers, after the same preparation for
    every tracer: a load and unload (the first load after boot reads other
    values), then 2 s for the link state the unload left to settle, so that
    each traced load finds the device alike.  also(): more, before end."""
    subprocess.run(["modprobe", "e1000"], check=True)
    subprocess.run(["rmmod", "e1000"], check=True)
    time.sleep(2.0)
    _write(TRACING / "trace_marker", begin + "\n")
    subprocess.run(["modprobe", "e1000"], check=True)
    if also is not None:
        also()
    _write(TRACING / "trace_marker", end + "\n")


def map_id_problems(text: str) -> list[str]:
    """Consistency of map ids: every access and UNMAP must name a mapping
    that is open at that point; every MAP a new id.  Returns the problems."""
    problems: list[str] = []
    open_ids: set[str] = set()
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if m := _MAP.match(line):
            mid = m.group(2)
            if mid in seen:
                problems.append(f"line {n}: map id {mid} reused: {line}")
            seen.add(mid)
            open_ids.add(mid)
        elif m := _UNMAP.match(line):
            mid = m.group(2)
            if mid not in open_ids:
                problems.append(f"line {n}: UNMAP of a mapping not open: {line}")
            open_ids.discard(mid)
        else:
            mid = (m.group(4) if (m := _RW.match(line))
                   else m.group(2) if (m := _UNKNOWN.match(line)) else None)
            if mid is not None and mid not in open_ids:
                problems.append(f"line {n}: access outside an open mapping: {line}")
    return problems
