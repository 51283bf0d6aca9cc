"""The tool's caches under /var/cache/mmiotrace-ng: what one start computes
slowly (compiled BPF objects, the sizes of the BTF's variables), later
starts read.  Only a directory this (root) user owns and nobody else may
write is read or written: what the BPF cache holds is loaded into the
kernel."""

from __future__ import annotations

import os
from pathlib import Path


def trusted_dir(path: Path) -> bool:
    """Whether path is a directory this user owns and nobody else may write."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def read_text(cache_dir: Path, name: str) -> str | None:
    """The file's text, None if it or a trusted directory is missing."""
    if not trusted_dir(cache_dir):
        return None
    try:
        return (cache_dir / name).read_text()
    except OSError:
        return None


def store_text(cache_dir: Path, name: str, text: str) -> None:
    """Write the file whole (a temporary file renamed over it).  Best
    effort: a cache that cannot be written only costs time."""
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not trusted_dir(cache_dir):
            return
        import tempfile

        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, cache_dir / name)
    except OSError:
        pass
