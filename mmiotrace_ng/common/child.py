"""`-- CMD ARGS`: the command a tracer runs once it is ready, and the exit
status it then gives (the command's; 128 + N if a signal N ended it)."""

from __future__ import annotations

import subprocess

from .errors import UsageError


def start(cmd: list[str]) -> subprocess.Popen[bytes] | None:
    """CMD started (None without one); UsageError if it cannot run."""
    if not cmd:
        return None
    try:
        return subprocess.Popen(cmd)
    except OSError as exc:
        raise UsageError(f"cannot run {cmd[0]}: {exc.strerror}") from exc


def ended(child: subprocess.Popen[bytes] | None) -> int | None:
    """The exit status to give once child has ended, None while it runs
    (or if there is none)."""
    if child is None or child.poll() is None:
        return None
    return child.returncode if child.returncode >= 0 else 128 - child.returncode
