"""The traced machine's symbols for a recording, modules unloaded meanwhile
included.

A recording keeps /proc/kallsyms as it is at the end of the run, so that the
modules a run loads (-- modprobe X) have their symbols in it.  A module
unloaded before the end (-- sh -c 'modprobe X; ...; rmmod X') would be
missing: so the module list is looked at as the run goes (poll, about twice
a second: /proc/modules is short), and when a module appears, /proc/kallsyms
is read in a thread (the read is the kernel's work, outside the GIL) and the
lines of modules are kept.  At the end, those of modules no longer loaded
are added to the final kallsyms text, and their /proc/modules lines to the
final module list.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Final

from .render import ENCODING, ERRORS

KALLSYMS: Final = Path("/proc/kallsyms")
MODULES: Final = Path("/proc/modules")
POLL_S: Final = 0.5


def _read(path: Path) -> str | None:
    try:
        return path.read_text(ENCODING, ERRORS)
    except OSError:
        return None


def _names(modules: str | None) -> set[str]:
    return {line.split(" ", 1)[0] for line in (modules or "").splitlines() if line}


class SymbolSnapshots:
    """Module symbols seen while tracing; final() gives the recording's
    kallsyms and modules texts."""

    def __init__(self) -> None:
        self.modules = _read(MODULES)
        self.seen = _names(self.modules)
        self.module_lines: dict[str, list[str]] = {}     # name -> its kallsyms lines
        self.module_rows: dict[str, str] = {             # name -> its /proc/modules line
            line.split(" ", 1)[0]: line + "\n" for line in (self.modules or "").splitlines()}
        self._lock = threading.Lock()
        self._next = time.monotonic() + POLL_S
        # the modules loaded now: one of them may go before the end
        self._thread: threading.Thread | None = threading.Thread(target=self._snapshot,
                                                                 daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """Look at the module list if it is time; read the symbols of new ones."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + POLL_S
        text = _read(MODULES)
        new = _names(text) - self.seen
        if not new or (self._thread is not None and self._thread.is_alive()):
            return      # a read under way sees them, or the next poll does
        self.seen |= new
        for line in (text or "").splitlines():
            if line.split(" ", 1)[0] in new:
                self.module_rows[line.split(" ", 1)[0]] = line + "\n"
        self._thread = threading.Thread(target=self._snapshot, daemon=True)
        self._thread.start()

    def _snapshot(self) -> None:
        text = _read(KALLSYMS)
        if text is None:
            return
        lines: dict[str, list[str]] = {}
        for line in text.splitlines(keepends=True):
            if line.endswith("]\n"):
                lines.setdefault(line[line.rfind("[") + 1 : -2], []).append(line)
        with self._lock:
            self.module_lines.update(lines)

    def final(self) -> tuple[str | None, str | None]:
        """(kallsyms, modules) now, with what was seen of the modules that
        are gone since."""
        if self._thread is not None:
            self._thread.join()
        kallsyms = _read(KALLSYMS)
        modules = _read(MODULES)
        if kallsyms is None:
            return None, modules
        gone = self.seen - _names(modules)
        with self._lock:
            extra = [line for name in sorted(gone) for line in self.module_lines.get(name, [])]
        rows = [self.module_rows[name] for name in sorted(gone) if name in self.module_rows]
        return kallsyms + "".join(extra), (modules or "") + "".join(rows)
