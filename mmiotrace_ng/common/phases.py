"""Where the start-up goes: with --verbose, each phase's time on stderr.

Times are CLOCK_BOOTTIME seconds from the moment the process started (its
start time in /proc/self/stat, 10 ms resolution), so the first phase counts
the interpreter's start and the imports too.
"""

from __future__ import annotations

import os
import sys
import time


def process_start() -> float:
    """When this process started, in CLOCK_BOOTTIME seconds."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return time.clock_gettime(time.CLOCK_BOOTTIME)


class Phases:
    """The phases seen so far, as (name, seconds); printed when enabled."""

    def __init__(self) -> None:
        self.enabled = False
        self.start = self.last = process_start()
        self.seen: list[tuple[str, float]] = []

    def enable(self) -> None:
        """Print the phases from now on, and those seen already."""
        self.enabled = True
        at = self.start
        for name, took in self.seen:
            at += took
            self._print(at, took, name)

    def done(self, name: str) -> None:
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        took, self.last = now - self.last, now
        self.seen.append((name, took))
        if self.enabled:
            self._print(now, took, name)

    def note(self, text: str) -> None:
        """A line that is not a phase (printed when enabled)."""
        if self.enabled:
            print(f"mmiotrace-ng: {'':>10} {text}", file=sys.stderr, flush=True)

    def _print(self, at: float, took: float, name: str) -> None:
        print(f"mmiotrace-ng: {at - self.start:6.2f} s (+{took:5.2f} s) {name}",
              file=sys.stderr, flush=True)


PHASES = Phases()
