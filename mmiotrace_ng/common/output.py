"""Where a command's text goes: a file it creates or standard output's bytes,
with the errors a user should see said as such.

A write error (a full disk, a file that cannot be created) is a UsageError
naming the file: one line and exit status 2.  A closed pipe
(`mmiotrace-ng report X | head`) raises ClosedPipe, which cli.main turns into
the quiet 128 + SIGPIPE exit of a pipeline's tools (closed_pipe)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Iterator
from typing import BinaryIO

from .errors import UsageError


class ClosedPipe(Exception):
    """Standard output's reader went away."""


@contextlib.contextmanager
def writing(path: str | None) -> Iterator[BinaryIO]:
    """The output to write to: the file at path (None or "-": standard
    output), flushed at the end and closed."""
    if path == "-":
        path = None
    try:
        out: BinaryIO = open(path, "wb") if path else sys.stdout.buffer  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from exc
    try:
        sys.stdout.flush()          # text printed before, then these bytes
        yield out
        out.flush()
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise ClosedPipe from exc
        raise UsageError(f"cannot write {path or 'standard output'}: {exc.strerror}") from exc
    finally:
        if path:
            with contextlib.suppress(OSError):
                out.close()


def closed_pipe() -> int:
    """The exit status after stdout's reader went away, which nothing more
    may reach, not even at exit (128 + SIGPIPE, as a pipeline's tools)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE
