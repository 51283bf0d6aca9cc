"""What the storm (storm.py) reads from the tracer's output, and its verdict.

Kept apart from the guest-only code so that host tests can feed the reader
broken output and see the verdict fail (tests/unit/test_storm_count.py).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import BinaryIO

SUMMARY = re.compile(r"map (\d+), unmap (\d+), access (\d+), mark (\d+)\), lost (\d+)")
LOST = re.compile(rb"^MARK 0\.000000 Lost (\d+) events\.$")
EXPECTED = {b"R", b"MAP", b"UNMAP", b"LOST", b"VERSION", b"PCIDEV"}


class LineCounter(threading.Thread):
    """Counts the lines of a stream by their first word; sums the losses."""

    def __init__(self, stream: BinaryIO) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.kinds: Counter[bytes] = Counter()
        self.lost = 0

    def line(self, ln: bytes) -> None:
        if m := LOST.match(ln):
            self.lost += int(m.group(1))
            self.kinds[b"LOST"] += 1
        else:
            self.kinds[ln.split(b" ", 1)[0]] += 1

    def run(self) -> None:
        rest = b""
        while chunk := self.stream.read1(1 << 20):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for ln in lines:
                if ln.startswith((b"R ", b"W ")):
                    self.kinds[ln[:1]] += 1
                else:
                    self.line(ln)
        if rest:
            self.line(rest)


def verdict(counter: LineCounter, made: int, status: int, stderr: str) -> list[str]:
    """The storm's failures (empty when it passed): the tracer's exit
    status, lines of an unexpected kind, records in the output plus the
    losses reported in it against the records made, and the tracer's
    summary against its output."""
    k = counter.kinds
    emitted, lost = k[b"R"] + k[b"MAP"] + k[b"UNMAP"], counter.lost
    failures = []
    if status != 0:
        failures.append(f"the tracer exited {status}:\n{stderr}")
    if set(k) - EXPECTED or k[b"VERSION"] != 1:
        failures.append(f"unexpected lines: {dict(k)}")
    if emitted + lost != made:
        failures.append(f"records in the output + lost ({emitted} + {lost}) != made ({made})")
    m = SUMMARY.search(stderr)
    if not m or (int(m[1]) + int(m[2]) + int(m[3]), int(m[5])) != (emitted, lost):
        failures.append(f"the summary disagrees with the output:\n{stderr}")
    return failures
