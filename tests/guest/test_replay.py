"""mmiotrace-ng replay against QEMU's edu device: a recording of the
exerciser having edu compute a factorial (write 0x08, poll the status 0x20
until idle, read 0x08), the liveness sequence (write 0x04, read it back),
a write of the DMA source register 0x80 and the liveness sequence again is
played back with the exerciser unbound.  Every read must match, edu must
compute the factorial again (it held another result before), and the
replay's own trace must diff equal to the recording; an edited read value
stops it at that line; --bisect finds the write of 0x80 that a check looks
for; a bound driver, another BAR layout and a damaged trace are each
refused in one line, with nothing written (the liveness register, set
before, reads the same after).

The test reads and writes edu itself through resource0 (mapped only while
no driver is bound: a driver's claim revokes such mappings).  The main
replay runs as the command does, in a process of its own; the others run
in this one (cli.main), which saves a Python start each (seconds under
TCG)."""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXERCISER_DEBUGFS
from ng_tracer import ARTIFACTS, NG

from mmiotrace_ng import cli

DRIVER = Path("/sys/bus/pci/drivers/edu_exerciser")
FACT_N = 1 << 26            # edu busy for tens of milliseconds: the poll sees it
FACT_OF_N = 0               # 2^26! mod 2^32 (34! already has 32 twos)
WVAL = 0x5EED
STEPS = [("stress", f"fact {FACT_N}"), ("run", "writel"), ("run", f"wval {WVAL}"),
         ("run", "writel")]
LIVE, FACT, STATUS, DMA_SRC = 0x04, 0x08, 0x20, 0x80
OUT = ARTIFACTS / "replay"


@contextlib.contextmanager
def bar0(bdf: str, size: int) -> Iterator[memoryview]:
    """edu's BAR0, mapped through sysfs by the test itself."""
    fd = os.open(f"/sys/bus/pci/devices/{bdf}/resource0", os.O_RDWR | os.O_SYNC)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    view = memoryview(mm)
    try:
        yield view
    finally:
        view.release()
        mm.close()


def reg(view: memoryview, offset: int, value: int | None = None) -> int:
    """Read (or write, then read) a 32-bit register."""
    word = view[offset:offset + 4].cast("I")
    if value is not None:
        word[0] = value
    return word[0]


def bound(bdf: str) -> bool:
    return (DRIVER / bdf).exists()


def bind(bdf: str, on: bool) -> None:
    if bound(bdf) != on:
        (DRIVER / ("bind" if on else "unbind")).write_text(bdf)
    assert bound(bdf) == on


def set_live(exerciser, value: int) -> int:
    """Write the liveness register (the driver unbound for it, then bound
    again as it was); what it reads now."""
    was = bound(exerciser.dev.name)
    bind(exerciser.dev.name, False)
    with bar0(exerciser.dev.name, exerciser.bar0[1]) as v:
        got = reg(v, LIVE, value)
    bind(exerciser.dev.name, was)
    return got


def live(exerciser) -> int:
    bind(exerciser.dev.name, False)
    with bar0(exerciser.dev.name, exerciser.bar0[1]) as v:
        return reg(v, LIVE)


@pytest.fixture(scope="module")
def recording(exerciser) -> Iterator[Path]:
    """The scenarios recorded by mmiotrace-ng (once for the module); the
    exerciser is bound again at the end."""
    OUT.mkdir(parents=True, exist_ok=True)
    rec = OUT / "replay.rec"
    rec.unlink(missing_ok=True)
    bind(exerciser.dev.name, True)
    script = "; ".join(f"echo '{line}' > {EXERCISER_DEBUGFS / f}" for f, line in STEPS)
    res = subprocess.run([*NG, "record", "--pci", exerciser.dev.name, "-o", str(rec), "--",
                          "sh", "-ec", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    try:
        yield rec
    finally:
        bind(exerciser.dev.name, True)


@pytest.fixture(scope="module")
def text(recording) -> list[str]:
    """The recording's text, as report prints it."""
    out = OUT / "replay.txt"
    assert cli.main(["report", str(recording), "-o", str(out)]) == 0
    return out.read_text().splitlines(keepends=True)


def replay(capsys, *argv: str) -> subprocess.CompletedProcess[str]:
    """mmiotrace-ng replay argv, run in this process."""
    capsys.readouterr()
    status = cli.main(["replay", *argv])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, out, err)


def line_of(lines: list[str], prefix: str, phys: int, value: int) -> int:
    """The number of the first line of an access (from 1)."""
    for n, line in enumerate(lines, 1):
        f = line.split(" ")
        if line.startswith(prefix) and f[4:6] == [f"{phys:#x}", f"{value:#x}"]:
            return n
    raise AssertionError(f"no {prefix}{phys:#x} {value:#x} in the trace")


def test_the_recording_polls_a_busy_device(exerciser, text):
    base = exerciser.bar0[0]
    status = [line.split(" ")[5] for line in text
              if line.startswith("R 4 ") and line.split(" ")[4] == f"{base + STATUS:#x}"]
    assert status[0] == "0x1" and status[-1] == "0x0", status


def test_replay_matches_computes_the_factorial_again_and_diffs_equal(exerciser, recording):
    bdf, (base, size) = exerciser.dev.name, exerciser.bar0
    bind(bdf, False)
    with bar0(bdf, size) as v:      # another result in 0x08 before the replay
        reg(v, FACT, 5)
        deadline = time.monotonic() + 10
        while reg(v, STATUS) & 1 and time.monotonic() < deadline:
            pass
        assert reg(v, FACT) == 120
    replayed = OUT / "replayed.txt"
    res = subprocess.run([*NG, "replay", str(recording), "--pci", bdf, "--poll-timeout", "10",
                          "-o", str(replayed)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr.endswith(": every read as recorded\n"), res.stderr
    with bar0(bdf, size) as v:
        assert reg(v, FACT) == FACT_OF_N
        assert reg(v, DMA_SRC) == WVAL
    text = replayed.read_text()
    assert f" {base + FACT:#x} {FACT_N:#x} " in text
    assert f" {base + STATUS:#x} 0x1 " in text      # seen busy, then idle
    assert cli.main(["diff", "--ignore-header", str(recording), str(replayed)]) == 0


def test_an_edited_value_stops_the_replay_at_its_line(exerciser, text, capsys):
    bdf, base = exerciser.dev.name, exerciser.bar0[0]
    lines = list(text)
    n = line_of(lines, "R 4 ", base + LIVE, 0xEDCBA987)
    lines[n - 1] = lines[n - 1].replace(" 0xedcba987 ", " 0xedcba986 ")
    edited = OUT / "edited.txt"
    edited.write_text("".join(lines))
    bind(bdf, False)
    res = replay(capsys, str(edited), "--pci", bdf, "--poll-timeout", "10",
                 "-o", str(OUT / "e.txt"))
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines()[0] == (f"mmiotrace-ng: replay: line {n}: R 4 "
                                          f"{base + LIVE:#x}: expected 0xedcba986, read "
                                          "0xedcba987")


def test_bisect_finds_the_write_the_check_looks_for(exerciser, recording, text, capsys):
    bdf, (base, size) = exerciser.dev.name, exerciser.bar0
    n = line_of(text, "W 4 ", base + DMA_SRC, WVAL)
    bind(bdf, False)
    with bar0(bdf, size) as v:
        assert reg(v, DMA_SRC, 0) == 0
    check = f'test "$(busybox devmem {base + DMA_SRC:#x} 32)" = 0x{WVAL:08X}'
    res = replay(capsys, str(recording), "--pci", bdf, "--poll-timeout", "10", "--bisect",
                 "--check", check)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (f"line {n}: W 4 {base + DMA_SRC:#x} {WVAL:#x}: write 3 of 4, the "
                          "last of the shortest prefix after which the check succeeds\n")


def damaged(lines: list[str]) -> list[str]:
    """The trace with a line cut short after the liveness write."""
    n = next(i for i, line in enumerate(lines) if line.startswith("W 4 ")
             and " 0x12345678 " in line)
    return [*lines[:n + 1], lines[n + 1][:12] + "\n", *lines[n + 2:]]


def other_layout(lines: list[str]) -> list[str]:
    """The trace with edu's BAR0 twice as large in its PCIDEV line."""
    out = []
    for line in lines:
        if line.startswith("PCIDEV ") and line.split(" ")[2] == "123411e8":
            f = line.split(" ")
            assert f[11] == "100000"
            f[11] = "200000"
            line = " ".join(f)
        out.append(line)
    return out


@pytest.mark.parametrize("case", ["bound driver", "other BAR layout", "damaged trace"])
def test_refusals_write_nothing(case, exerciser, recording, text, capsys):
    bdf = exerciser.dev.name
    path = recording
    if case != "bound driver":
        path = OUT / "refused.txt"
        path.write_text("".join((other_layout if case == "other BAR layout" else damaged)(
            text)))
    assert set_live(exerciser, 0x0BADF00D) == 0xF4520FF2
    bind(bdf, case == "bound driver")
    res = replay(capsys, str(path), "--pci", bdf, "-o", str(OUT / "refused-out.txt"))
    said = {"bound driver": f"{bdf} is bound to the driver edu_exerciser",
            "other BAR layout": "the trace's BARs (BAR0 0x200000) are not",
            "damaged trace": "is not a trace line"}[case]
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert res.stderr.count("\n") == 1 and said in res.stderr, res.stderr
    assert not (OUT / "refused-out.txt").exists()
    assert live(exerciser) == 0xF4520FF2
