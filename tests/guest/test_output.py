"""The output side: the trace is a byte stream end to end, and a closed pipe,
a full filesystem or a file that cannot be created stop tracing cleanly:
no traceback, and nothing left armed, which is read from the kernel's page
table with a mapping held open across the run (held.py), not from the
helper's STATUS alone."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from held import assert_left_whole, held_pages, hold
from kernel_tracer import KernelMmiotrace
from ng_tracer import MARKER, NG, NgTracer, helper_status

RUN = Path("/sys/kernel/debug/edu_exerciser/run")


def assert_disarmed() -> None:
    st = helper_status()
    assert st["armed_pages"] == 0 and st["filters"] == 0 and st["owner"] == 0, st


def mark_lines(text: bytes) -> list[bytes]:
    """The text of each MARK line, times taken out (a NUL in a marker ends
    its line without a newline: the next MARK follows on the same line)."""
    text = re.sub(rb"MARK \d+\.\d{6} ", b"MARK ", text)
    return [ln[5:] for ln in text.split(b"\n") if ln.startswith(b"MARK ")]


MARKERS = [b"x\xffy\n", b"nul\x00after\n", b"100% %s %n\n", b"\xc3\xa9t\xc3\xa9\n",
           b"long " + b"L" * 1500 + b"\n"]


def test_marker_bytes_as_the_kernel_prints_them(exerciser):
    """Markers with bytes that are not UTF-8, NUL, % and longer than the limit:
    the same bytes as the kernel's tracer prints, in the same boot."""
    def write_all() -> None:
        for m in MARKERS:
            fd = os.open(MARKER, os.O_WRONLY)
            try:
                os.write(fd, m)
            finally:
                os.close(fd)

    kt = KernelMmiotrace(quiet=1.0)
    kt.start()
    try:
        write_all()
        kt.wait(lambda text: "long LLL" in text)
    finally:
        kt.stop()
    kernel = kt.data
    t = NgTracer(["--pci", exerciser.dev.name], "ng-marker-bytes").start()
    try:
        write_all()
        t.wait_for("long LLL")
    finally:
        assert t.stop() == 0, t.stderr()
    ours = t.out.read_bytes()
    want = [ln for ln in mark_lines(kernel) if not ln.startswith(b"ng-")]
    got = [ln for ln in mark_lines(ours) if not ln.startswith(b"ng-")]
    # the NUL ends its marker's line without a newline: one line fewer
    assert got == want and len(want) == len(MARKERS) - 1
    assert want[0] == b"x\xffy" and want[1] == b"nulMARK 100% %s %n"
    # the kernel keeps 1 KiB of a marker on 6.1, 4 KiB on 6.12: all of this one
    assert want[3].startswith(b"long LLLL")


def test_closed_pipe_stops_quietly(held):
    """mmiotrace-ng ... | head -1: a quiet stop, 128 + SIGPIPE, nothing armed."""
    exerciser = held
    hold("map")
    proc = subprocess.Popen([*NG, "--pci", exerciser.dev.name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    assert first == b"VERSION 20070824\n"
    while held_pages()[2] and proc.poll() is None:   # armed once ready
        time.sleep(0.2)
    proc.stdout.close()                        # what head does after its line
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        exerciser.run("rloop", 2000)           # records to write into the closed pipe
    assert proc.wait(60) == 141
    err = proc.stderr.read().decode(errors="replace")
    assert "Traceback" not in err and "Error" not in err, err
    assert_disarmed()
    assert_left_whole(exerciser)


def test_output_file_that_cannot_be_created(held):
    exerciser = held
    hold("map")
    res = subprocess.run([*NG, "--pci", exerciser.dev.name, "-o", "/nonexistent/dir/x.txt",
                          "--", "true"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines == ["mmiotrace-ng: cannot write /nonexistent/dir/x.txt: "
                     "No such file or directory"], lines
    assert_disarmed()
    assert_left_whole(exerciser)


def test_full_filesystem_stops_tracing(held):
    """-o on a tmpfs that fills up during a burst: exit 2, one line, nothing armed."""
    exerciser = held
    hold("map")
    mnt = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt], check=True)
    try:
        res = subprocess.run([*NG, "--pci", exerciser.dev.name, "-o", f"{mnt}/trace.txt",
                              "--", "sh", "-c", f"echo 'rloop 100000' > {RUN}"],
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert "cannot write the trace to" in last and "No space left on device" in last, last
        assert_disarmed()
        assert_left_whole(exerciser)
    finally:
        subprocess.run(["umount", mnt], check=False)
        os.rmdir(mnt)
