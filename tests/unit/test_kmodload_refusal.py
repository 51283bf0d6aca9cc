"""When the helper refuses to load, the loader says the helper's own reason
(its kernel-log lines, read from /dev/kmsg across the insmod) in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mmiotrace_ng.common.bpfload import LoaderError
from mmiotrace_ng.tracer import kmodload

RECORDS = ("6,1201,5,-;e1000: unrelated\n"
           "3,1202,6,-;mmiotng: cannot hook bad_area_nosemaphore (ftrace): -16\n"
           " SUBSYSTEM=none\n"
           "3,1203,7,-;mmiotng: this kernel cannot be served: x has a clone x.isra.0\n")


def test_helper_lines_are_picked_from_kmsg_records(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(RECORDS)
    fd = os.open(log, os.O_RDONLY)
    assert kmodload._helper_said(fd) == [
        "cannot hook bad_area_nosemaphore (ftrace): -16",
        "this kernel cannot be served: x has a clone x.isra.0"]


def test_a_refused_insmod_says_the_helpers_reason(tmp_path, monkeypatch):
    log = tmp_path / "kmsg"
    log.write_text("")
    monkeypatch.setattr(kmodload, "_kmsg_end", lambda: os.open(log, os.O_RDONLY))

    def insmod(cmd, **_kw):
        log.write_text(RECORDS)     # what the kernel logs during the insmod
        return subprocess.CompletedProcess(cmd, 1, "", "insmod: ERROR: Operation not permitted")

    monkeypatch.setattr(kmodload.subprocess, "run", insmod)
    with pytest.raises(LoaderError) as exc:
        kmodload._insmod(Path("/x/mmiotng.ko"))
    msg = str(exc.value)
    assert msg == ("the helper module refused to load: cannot hook bad_area_nosemaphore "
                   "(ftrace): -16; this kernel cannot be served: x has a clone x.isra.0")


def test_without_the_helpers_word_insmods_error_is_said(tmp_path, monkeypatch):
    monkeypatch.setattr(kmodload, "_kmsg_end", lambda: None)
    monkeypatch.setattr(kmodload.subprocess, "run", lambda cmd, **_kw: subprocess.CompletedProcess(
        cmd, 1, "", "insmod: ERROR: could not insert module: Invalid module format\n"))
    with pytest.raises(LoaderError, match="Invalid module format"):
        kmodload._insmod(Path("/x/mmiotng.ko"))
