"""Making a plan's accesses on a device, and the replay's own trace of them.

Writes are made with their width and value; reads are made and compared
with the trace's value; a poll is read again and again until its last
value comes or the poll timeout passes.  A mismatch stops the replay unless
keep_going.  Between two accesses (never during one) the player asks
whether to stop: a SIGINT, or --step's answer.  With keep_timing the
recorded gap before each access is kept (a poll's reads are spaced by their
recorded mean interval); otherwise it goes as fast as the device answers.

The replay's trace is 20070824 text, what the tracer would have printed of
the accesses made, at the device's addresses: VERSION, the device's PCIDEV
line, then the MAP, R, W, UNMAP and MARK lines in order, each read with the
value it got; `mmiotrace-ng diff` compares it with the trace replayed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO, Final

from ..format.render import ENCODING, ERRORS, VERSION_LINE
from .device import Device
from .plan import Step

SLEEP_SLICE: Final = 0.05       # seconds: how often a long wait looks for a stop


@dataclass
class Options:
    poll_timeout: float = 1.0
    keep_going: bool = False
    keep_timing: bool = False


@dataclass
class Mismatch:
    step: Step
    got: int
    reads: int          # reads made of it (a poll: more than one)

    def describe(self, poll_timeout: float) -> str:
        s = self.step
        where = f"line {s.line}" if s.reads == 1 else f"lines {s.first_line}-{s.line}"
        what = f"R {s.width} {s.trace_phys:#x}"
        if s.reads == 1:
            return f"{where}: {what}: expected {s.value:#x}, read {self.got:#x}"
        return (f"{where}: {what} (a poll of {s.reads} reads): expected {s.value:#x} within "
                f"{poll_timeout:g} s, read {self.got:#x} ({self.reads} reads)")


@dataclass
class Outcome:
    writes: int = 0
    reads: int = 0              # reads made, every read of a poll counted
    polls: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    stopped_before: Step | None = None     # a stop asked for (SIGINT, --step)
    ended_early: bool = False               # after_write said so (bisect)


class TraceWriter:
    """The replay's own trace, as the tracer prints one."""

    def __init__(self, out: BinaryIO, pcidev: str | None) -> None:
        self.out = out
        self.pid = os.getpid()
        out.write((VERSION_LINE + (pcidev or "")).encode(ENCODING, ERRORS))

    def _put(self, text: str) -> None:
        self.out.write(text.encode(ENCODING, ERRORS))

    @staticmethod
    def _now() -> float:
        return time.clock_gettime(time.CLOCK_MONOTONIC)

    def access(self, s: Step, value: int) -> None:
        self._put(f"{s.kind} {s.width} {self._now():.6f} {s.map_id} {s.phys:#x} {value:#x} "
                  f"0x0 {self.pid}\n")

    def map(self, s: Step, virt: int) -> None:
        self._put(f"MAP {self._now():.6f} {s.map_id} {s.phys:#x} {virt:#x} {s.length:#x} "
                  f"0x0 {self.pid}\n")

    def unmap(self, s: Step) -> None:
        self._put(f"UNMAP {self._now():.6f} {s.map_id} 0x0 {self.pid}\n")

    def mark(self, s: Step) -> None:
        self._put(f"MARK {self._now():.6f} {s.text}\n")


class Player:
    """Plays steps to a device.  interrupted() is asked before each access
    and while a poll or a pause waits (True: stop there); confirm(step),
    if given, before each access (--step; False: stop there); report(text)
    says a mismatch as it happens."""

    def __init__(self, device: Device, options: Options, trace: TraceWriter | None,
                 interrupted: Callable[[], bool], report: Callable[[str], None],
                 confirm: Callable[[Step], bool] | None = None) -> None:
        self.device = device
        self.options = options
        self.trace = trace
        self.interrupted = interrupted
        self.confirm = confirm
        self.report = report
        self._last_ts: float | None = None        # the trace's time of the last access
        self._last_done = 0.0                     # when it was made (monotonic)

    def play(self, steps: list[Step],
             after_write: Callable[[int, Step], bool] | None = None) -> Outcome:
        """Make the steps' accesses in order.  after_write(n, step) is called
        after the n-th write (from 1); True ends the replay there."""
        out = Outcome()
        trace = self.trace
        for s in steps:
            if s.kind == "MAP":
                if trace:
                    trace.map(s, self.device.virt(s.bar, s.offset))
                continue
            if s.kind == "UNMAP":
                if trace:
                    trace.unmap(s)
                continue
            if s.kind == "MARK":
                if trace:
                    trace.mark(s)
                continue
            if self.interrupted() or (self.confirm is not None and not self.confirm(s)):
                out.stopped_before = s
                return out
            self._pace(s.first_ts)
            if self.interrupted():
                out.stopped_before = s
                return out
            if s.kind == "W":
                self.device.write(s.bar, s.offset, s.width, s.value)
                self._done(s)
                if trace:
                    trace.access(s, s.value)
                out.writes += 1
                if after_write is not None and after_write(out.writes, s):
                    out.ended_early = True
                    return out
                continue
            mismatch = self._read(s, out)
            if mismatch is not None:
                out.mismatches.append(mismatch)
                self.report(mismatch.describe(self.options.poll_timeout))
                if not self.options.keep_going:
                    return out
            if out.stopped_before is not None:
                return out
        return out

    def _read(self, s: Step, out: Outcome) -> Mismatch | None:
        dev, trace = self.device, self.trace
        got = dev.read(s.bar, s.offset, s.width)
        self._done(s)
        out.reads += 1
        if trace:
            trace.access(s, got)
        if got == s.value or s.reads == 1:
            return None if got == s.value else Mismatch(s, got, 1)
        out.polls += 1
        made = 1
        deadline = time.monotonic() + self.options.poll_timeout
        interval = (s.ts - s.first_ts) / (s.reads - 1) if self.options.keep_timing else 0.0
        while got != s.value:
            if time.monotonic() >= deadline:
                return Mismatch(s, got, made)
            if self.interrupted():
                out.stopped_before = s
                return None
            if interval > 0:
                self._sleep(interval)
            got = dev.read(s.bar, s.offset, s.width)
            made += 1
            out.reads += 1
            if trace:
                trace.access(s, got)
        self._done(s)
        return None

    def _done(self, s: Step) -> None:
        self._last_ts = s.ts
        self._last_done = time.monotonic()

    def _pace(self, ts: float) -> None:
        """With keep_timing, wait until the recorded gap since the last
        access has passed."""
        if not self.options.keep_timing or self._last_ts is None:
            return
        wait = (ts - self._last_ts) - (time.monotonic() - self._last_done)
        if wait > 0:
            self._sleep(wait)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, SLEEP_SLICE))
            if self.interrupted():
                return
