"""Texts put in order of their times, in bounded memory: up to RUN in
memory, each full batch sorted and spilled to a temporary file, all merged
at the end (export writes its events in time order this way)."""

from __future__ import annotations

import heapq
import tempfile
from collections.abc import Iterator
from typing import IO, Final

RUN: Final = 1 << 18            # texts held in memory at most


class TimeOrder:
    """add() texts with their times; items() gives them back sorted by
    time, those of one time in the order they were added.  A text must
    not hold a newline."""

    def __init__(self, run: int = RUN) -> None:
        self.run = run
        self.held: list[tuple[int, int, str]] = []
        self.spilled: list[IO[str]] = []
        self.seq = 0

    def add(self, ts: int, text: str) -> None:
        self.held.append((ts, self.seq, text))
        self.seq += 1
        if len(self.held) >= self.run:
            self._spill()

    def _spill(self) -> None:
        self.held.sort()
        fh = tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogatepass",
                                    prefix="mmiotrace-ng-")
        fh.writelines(f"{ts} {seq} {text}\n" for ts, seq, text in self.held)
        fh.seek(0)
        self.spilled.append(fh)
        self.held = []

    def items(self) -> Iterator[tuple[int, str]]:
        """The texts with their times, in order (once: it ends the sorting)."""
        self.held.sort()
        runs = [iter(self.held), *map(_read, self.spilled)]
        try:
            for ts, _, text in heapq.merge(*runs):
                yield ts, text
        finally:
            for fh in self.spilled:
                fh.close()
            self.spilled, self.held = [], []


def _read(fh: IO[str]) -> Iterator[tuple[int, int, str]]:
    for line in fh:
        ts, seq, text = line.rstrip("\n").split(" ", 2)
        yield int(ts), int(seq), text
