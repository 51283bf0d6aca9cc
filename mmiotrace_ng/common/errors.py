"""The error every command turns into one line and exit status 2."""

from __future__ import annotations

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input or an unusable environment: message, exit status 2."""
