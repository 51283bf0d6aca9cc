"""mmiotrace-ng replay on the host: against a model of QEMU's edu device
(a factorial register whose status stays busy for N reads, a liveness
register that reads the inverse of the last write), and through its sysfs
layer against temporary files standing for a device's sysfs directory and
its resource0.  The traces are written here by hand; what the device must
see and answer is known from the model, not from the code under test."""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path

import pytest

from mmiotrace_ng import cli
from mmiotrace_ng.common.errors import UsageError
from mmiotrace_ng.replay import command
from mmiotrace_ng.replay.device import DeviceError, SysfsDevice, describe
from mmiotrace_ng.replay.plan import Selection, Step, fold_polls

BDF = "0000:00:05.0"
BAR0 = 0xFEA00000
SIZE = 0x1000
IDENT = 0x010000ED
PCIDEV = "PCIDEV 0028 123411e8 b fea00000 0 0 0 0 0 0 1000 0 0 0 0 0 0 edu_exerciser\n"

# line numbers: VERSION 1, PCIDEV 2, MAP 3, ...
TRACE = [
    "VERSION 20070824\n",
    PCIDEV,
    "MAP 1.000000 1 0xfea00000 0xffffc90000100000 0x1000 0x0 0\n",
    "W 4 1.000100 1 0xfea00008 0x5 0x0 7\n",            # 4: 5! please
    "R 4 1.000200 1 0xfea00020 0x1 0x0 7\n",            # 5-7: the poll
    "R 4 1.000300 1 0xfea00020 0x1 0x0 7\n",
    "R 4 1.000400 1 0xfea00020 0x0 0x0 7\n",
    "R 4 1.000500 1 0xfea00008 0x78 0x0 7\n",           # 8: 120
    "W 4 1.000600 1 0xfea00004 0x12345678 0x0 7\n",     # 9
    "R 4 1.000700 1 0xfea00004 0xedcba987 0x0 7\n",     # 10
    "R 4 1.000800 1 0xfea00000 0x10000ed 0x0 7\n",      # 11
    "UNMAP 1.000900 1 0x0 7\n",
]
# what the model sees of TRACE with a factorial busy for 4 reads of the status
SEEN = [("W", 0, 0x08, 4, 5), *[("R", 0, 0x20, 4, 1)] * 4, ("R", 0, 0x20, 4, 0),
        ("R", 0, 0x08, 4, 120), ("W", 0, 0x04, 4, 0x12345678), ("R", 0, 0x04, 4, 0xEDCBA987),
        ("R", 0, 0x00, 4, IDENT)]


class FakeEdu:
    """A model of edu's registers, by BAR offset; every access logged as
    (op, bar, offset, width, value)."""

    def __init__(self, busy_reads: int = 4, on_write=None) -> None:
        self.busy_reads = busy_reads
        self.on_write = on_write
        self.log: list[tuple[str, int, int, int, int]] = []
        self.live = 0
        self.fact = 0
        self.result = 0
        self.busy = 0
        self.closed = False

    def read(self, bar: int, offset: int, width: int) -> int:
        if offset == 0x00:
            value = IDENT
        elif offset == 0x04:
            value = self.live
        elif offset == 0x20:
            if self.busy:
                self.busy -= 1
                value = 1
            else:
                value = 0
                self.fact = self.result
        elif offset == 0x08:
            value = self.fact if self.busy else self.result
        else:
            value = 0xFFFFFFFF
        self.log.append(("R", bar, offset, width, value))
        return value

    def write(self, bar: int, offset: int, width: int, value: int) -> None:
        self.log.append(("W", bar, offset, width, value))
        if offset == 0x04:
            self.live = ~value & 0xFFFFFFFF
        elif offset == 0x08:
            self.fact = value
            self.result = {5: 120, 6: 720}.get(value, 0)
            self.busy = self.busy_reads
        if self.on_write is not None:
            self.on_write(offset)

    def virt(self, bar: int, offset: int) -> int:
        return 0x7F0000000000 + offset

    def close(self) -> None:
        self.closed = True


def make_sysfs(root: Path, bars: dict[int, tuple[int, int]] | None = None,
               driver: str | None = None) -> Path:
    """A sysfs tree with the device BDF: its resource file (memory BARs
    given as index: (start, size)), ids, resourceN files, a driver link."""
    bars = {0: (BAR0, SIZE)} if bars is None else bars
    dev = root / "bus/pci/devices" / BDF
    dev.mkdir(parents=True)
    rows = []
    for i in range(13):
        if i in bars:
            start, size = bars[i]
            rows.append(f"0x{start:016x} 0x{start + size - 1:016x} 0x0000000000040200")
            (dev / f"resource{i}").write_bytes(bytes(size))
        else:
            rows.append(f"0x{0:016x} 0x{0:016x} 0x{0:016x}")
    (dev / "resource").write_text("\n".join(rows) + "\n")
    (dev / "vendor").write_text("0x1234\n")
    (dev / "device").write_text("0x11e8\n")
    if driver:
        drv = root / "bus/pci/drivers" / driver
        drv.mkdir(parents=True)
        (dev / "driver").symlink_to(drv)
    return dev


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    make_sysfs(tmp_path / "sys")
    return tmp_path / "sys"


def write_trace(tmp_path: Path, lines: list[str], name: str = "t.txt") -> str:
    path = tmp_path / name
    path.write_text("".join(lines))
    return str(path)


def replay(argv: list[str], sysfs: Path, device, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of mmiotrace-ng replay argv with the
    device under sysfs opened as `device` (a model, or None: the sysfs
    files themselves), as cli.main runs it."""
    opened: list[set[int]] = []

    def open_device(info, bars):
        opened.append(bars)
        return device if device is not None else SysfsDevice(info, bars)

    args = cli.build_parser().parse_args(["replay", *argv])
    try:
        status = command.replay(args, sysfs_root=sysfs, proc_pci="/nonexistent",
                                open_device=open_device)
    except UsageError as exc:
        print(f"mmiotrace-ng: {exc}", file=__import__("sys").stderr)
        status = 2
    out, err = capsys.readouterr()
    return status, out, err


def test_every_read_matches_and_the_replays_trace_diffs_equal(sysfs, tmp_path, capsys):
    trace = write_trace(tmp_path, TRACE)
    dev = FakeEdu(busy_reads=4)
    out = tmp_path / "replayed.txt"
    status, stdout, err = replay([trace, "--pci", "00:05.0", "-o", str(out)], sysfs, dev,
                                 capsys)
    assert status == 0, err
    assert dev.log == SEEN
    assert dev.closed
    assert stdout == ""
    assert err == ("mmiotrace-ng: replay: 0000:00:05.0: 2 writes, 8 reads (1 polls): every "
                   "read as recorded\n")
    text = out.read_text()
    assert text.startswith("VERSION 20070824\nMAP ")
    assert text.count("\nR 4 ") == 8 and " 0xfea00020 0x1 0x0 " in text
    assert cli.main(["diff", "--ignore-header", trace, str(out)]) == 0
    assert cli.main(["diff", trace, str(out)]) == 1    # its PCIDEV line is not in it
    capsys.readouterr()


def test_a_poll_that_was_over_at_once_is_read_once(sysfs, tmp_path, capsys):
    trace = write_trace(tmp_path, TRACE)
    dev = FakeEdu(busy_reads=0)
    status, _, err = replay([trace, "--pci", BDF, "-o", str(tmp_path / "o")], sysfs, dev,
                            capsys)
    assert status == 0, err
    assert [a for a in dev.log if a[2] == 0x20] == [("R", 0, 0x20, 4, 0)]


def edited(line: int, old: str, new: str) -> list[str]:
    lines = list(TRACE)
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new)
    return lines


def test_a_mismatch_stops_at_its_line(sysfs, tmp_path, capsys):
    trace = write_trace(tmp_path, edited(8, "0x78", "0x79"))
    dev = FakeEdu()
    status, _, err = replay([trace, "--pci", BDF, "-o", str(tmp_path / "o")], sysfs, dev,
                            capsys)
    assert status == 1
    assert err.splitlines()[0] == ("mmiotrace-ng: replay: line 8: R 4 0xfea00008: expected "
                                   "0x79, read 0x78")
    assert dev.log == SEEN[:7]          # nothing after the mismatch


def test_keep_going_goes_on_after_a_mismatch(sysfs, tmp_path, capsys):
    lines = edited(8, "0x78", "0x79")
    lines[9] = lines[9].replace("0xedcba987", "0x0")
    trace = write_trace(tmp_path, lines)
    dev = FakeEdu()
    status, _, err = replay([trace, "--pci", BDF, "--keep-going", "-o", str(tmp_path / "o")],
                            sysfs, dev, capsys)
    assert status == 1
    assert dev.log == SEEN
    assert "line 8: R 4 0xfea00008: expected 0x79, read 0x78\n" in err
    assert "line 10: R 4 0xfea00004: expected 0x0, read 0xedcba987\n" in err
    assert err.endswith("2 mismatches\n")


def test_a_poll_that_never_ends_times_out(sysfs, tmp_path, capsys):
    trace = write_trace(tmp_path, TRACE)
    dev = FakeEdu(busy_reads=10**9)
    status, _, err = replay([trace, "--pci", BDF, "--poll-timeout", "0.05",
                             "-o", str(tmp_path / "o")], sysfs, dev, capsys)
    assert status == 1
    first = err.splitlines()[0]
    assert first.startswith("mmiotrace-ng: replay: lines 5-7: R 4 0xfea00020 (a poll of 3 "
                            "reads): expected 0x0 within 0.05 s, read 0x1 (")
    assert dev.log[-1] == ("R", 0, 0x20, 4, 1)
    assert not any(a[0] == "W" and a[2] == 0x04 for a in dev.log)


def test_addresses_are_rebased_by_their_offset_in_the_bar(tmp_path, capsys):
    root = tmp_path / "sys"
    make_sysfs(root, {0: (0xC0000000, SIZE)})
    trace = write_trace(tmp_path, TRACE)
    out = tmp_path / "o"
    dev = FakeEdu()
    status, _, err = replay([trace, "--pci", BDF, "-o", str(out)], root, dev, capsys)
    assert status == 0, err
    assert dev.log == SEEN
    lines = out.read_text().splitlines()
    assert lines[1].split(" ")[3:6] == ["0xc0000000", "0x7f0000000000", "0x1000"]
    assert lines[2].split(" ")[4:6] == ["0xc0000008", "0x5"]


def one_line_refusal(status: int, out: str, err: str, said: str) -> None:
    assert (status, out) == (2, "")
    assert err.count("\n") == 1 and said in err, err


@pytest.mark.parametrize("bars", [{0: (BAR0, 0x2000)}, {0: (BAR0, SIZE), 2: (0xC0000000, SIZE)},
                                  {1: (BAR0, SIZE)}])
def test_a_trace_of_another_bar_layout_is_refused(bars, tmp_path, capsys):
    root = tmp_path / "sys"
    make_sysfs(root, bars)
    trace = write_trace(tmp_path, TRACE)
    dev = FakeEdu()
    out = tmp_path / "o"
    status, stdout, err = replay([trace, "--pci", BDF, "-o", str(out)], root, dev, capsys)
    one_line_refusal(status, stdout, err, "mmiotrace-ng: " + trace + ": the trace's BARs "
                     "(BAR0 0x1000) are not 0000:00:05.0's (")
    assert dev.log == [] and not out.exists()


def test_a_bound_driver_is_refused_unless_forced(tmp_path, capsys):
    root = tmp_path / "sys"
    make_sysfs(root, driver="edu_exerciser")
    trace = write_trace(tmp_path, TRACE)
    dev = FakeEdu()
    status, stdout, err = replay([trace, "--pci", BDF, "-o", str(tmp_path / "o")], root, dev,
                                 capsys)
    one_line_refusal(status, stdout, err, "0000:00:05.0 is bound to the driver edu_exerciser")
    assert dev.log == []
    status, _, err = replay([trace, "--pci", BDF, "--force", "-o", str(tmp_path / "o")],
                            root, dev, capsys)
    assert status == 0, err
    assert dev.log == SEEN


DAMAGED = {
    "a cut line": (["R 4 1.001000 1 0xfea0\n"], "line 13 is not a trace line: "),
    "a line of junk": (["hello\n"], "line 13 is not a trace line: 'hello'"),
    "past the BAR's end": (["W 4 1.001000 1 0xfea00ffe 0x1 0x0 7\n"],
                           "line 13: 4 bytes at 0xfea00ffe go past the end of BAR0"),
    "a width": (["W 3 1.001000 1 0xfea00004 0x1 0x0 7\n"], "line 13: a 3-byte access"),
    "a value too wide": (["W 1 1.001000 1 0xfea00004 0x100 0x0 7\n"],
                         "line 13: 0x100 does not fit 1 bytes"),
    "an UNKNOWN access": (["UNKNOWN 1.001000 1 0xfea00080 f3,a5,f6 0x0 7\n"],
                          "line 13: an access by an instruction the tracer did not decode"),
    "lost events": (["MARK 0.000000 Lost 12 events.\n"],
                    "line 13: the trace lost events there (Lost 12 events.)"),
}


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_trace_is_refused_before_anything_is_written(damage, sysfs, tmp_path,
                                                               capsys):
    extra, said = DAMAGED[damage]
    trace = write_trace(tmp_path, TRACE + extra)    # at the end: after every write
    dev = FakeEdu()
    status, stdout, err = replay([trace, "--pci", BDF, "-o", str(tmp_path / "o")], sysfs, dev,
                                 capsys)
    one_line_refusal(status, stdout, err, said)
    assert dev.log == [] and not (tmp_path / "o").exists()


def test_a_trace_of_another_device_is_refused(sysfs, tmp_path, capsys):
    lines = [TRACE[0], TRACE[1].replace("123411e8", "8086100e"), *TRACE[2:]]
    status, stdout, err = replay([write_trace(tmp_path, lines), "--pci", BDF, "--dry-run"],
                                 sysfs, FakeEdu(), capsys)
    one_line_refusal(status, stdout, err, "the trace has no device 1234:11e8")


def test_without_pcidev_lines_the_maps_must_lie_in_the_devices_bars(sysfs, tmp_path, capsys):
    dev = FakeEdu()
    trace = write_trace(tmp_path, [TRACE[0], *TRACE[2:]])
    status, _, err = replay([trace, "--pci", BDF, "-o", str(tmp_path / "o")], sysfs, dev,
                            capsys)
    assert status == 0, err
    assert dev.log == SEEN
    moved = [line.replace("0xfea0", "0xfeb0") for line in TRACE[2:]]
    status, stdout, err = replay([write_trace(tmp_path, [TRACE[0], *moved], "m.txt"),
                                  "--pci", BDF, "-o", str(tmp_path / "o2")], sysfs, FakeEdu(),
                                 capsys)
    one_line_refusal(status, stdout, err, "line 2: MAP 0xfeb00000 0x1000 is not inside a BAR")


def test_accesses_to_other_devices_are_left_out(sysfs, tmp_path, capsys):
    other = ["W 4 1.000650 2 0xfeb40000 0x1 0x0 7\n"]
    lines = TRACE[:9] + other + TRACE[9:]
    dev = FakeEdu()
    status, _, err = replay([write_trace(tmp_path, lines), "--pci", BDF,
                             "-o", str(tmp_path / "o")], sysfs, dev, capsys)
    assert status == 0, err
    assert dev.log == SEEN
    assert "1 accesses of the trace to other devices left out" in err


MARKED = [*TRACE[:8], "MARK 1.000550 live\n", *TRACE[8:10], "MARK 1.000750 ident\n",
          *TRACE[10:]]


@pytest.mark.parametrize("argv,seen", [
    (["--from", "live"], SEEN[7:]),
    (["--from", "live", "--until", "ident"], SEEN[7:9]),
    (["--until", "live"], SEEN[:7]),
    (["--lines", "10-11"], SEEN[7:9]),
    (["--lines", "12-"], SEEN[9:]),
    (["--only-writes"], [SEEN[0], SEEN[7]]),
])
def test_sections(argv, seen, sysfs, tmp_path, capsys):
    dev = FakeEdu()
    status, _, err = replay([write_trace(tmp_path, MARKED), "--pci", BDF, *argv,
                             "-o", str(tmp_path / "o")], sysfs, dev, capsys)
    assert status == 0, err
    assert dev.log == seen


def test_a_mark_that_is_not_there(sysfs, tmp_path, capsys):
    status, stdout, err = replay([write_trace(tmp_path, MARKED), "--pci", BDF, "--from",
                                  "nope"], sysfs, FakeEdu(), capsys)
    one_line_refusal(status, stdout, err, "no MARK 'nope' in the trace (--from)")


def test_dry_run_touches_nothing(sysfs, tmp_path, capsys):
    dev = FakeEdu()
    status, out, err = replay([write_trace(tmp_path, TRACE), "--pci", BDF, "--dry-run"],
                              sysfs, dev, capsys)
    assert (status, err) == (0, "")
    assert dev.log == []
    assert out.splitlines()[:4] == [
        "line 3: MAP BAR0+0x0 0x1000",
        "line 4: W 4 BAR0+0x8 0x5 (0xfea00008)",
        "lines 5-7: R 4 BAR0+0x20 until 0x0 (0xfea00020; a poll of 3 reads)",
        "line 8: R 4 BAR0+0x8 expect 0x78 (0xfea00008)"]


def test_sigint_stops_between_two_accesses(sysfs, tmp_path, capsys):
    def interrupt(offset: int) -> None:
        if offset == 0x08:
            os.kill(os.getpid(), signal.SIGINT)

    dev = FakeEdu(on_write=interrupt)
    before = signal.getsignal(signal.SIGINT)
    status, _, err = replay([write_trace(tmp_path, TRACE), "--pci", BDF,
                             "-o", str(tmp_path / "o")], sysfs, dev, capsys)
    assert status == 130
    assert dev.log == SEEN[:1]
    assert err.endswith("mmiotrace-ng: replay: stopped before line 7\n")
    assert signal.getsignal(signal.SIGINT) is before


def test_step_asks_before_each_access(sysfs, tmp_path, capsys, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.StringIO("\n\nq\n"))
    dev = FakeEdu(busy_reads=0)
    status, _, err = replay([write_trace(tmp_path, TRACE), "--pci", BDF, "--step",
                             "-o", str(tmp_path / "o")], sysfs, dev, capsys)
    assert status == 130
    assert dev.log == [SEEN[0], ("R", 0, 0x20, 4, 0)]
    assert err.count("[Enter: do it, q: stop]") == 3


# --- the device's resource files --------------------------------------------------


def test_the_sysfs_layer_makes_exact_accesses_inside_the_bar(sysfs):
    info = describe("00:05.0", sysfs)
    assert (info.vendor, info.device, info.driver) == (0x1234, 0x11E8, None)
    assert {i: (b.start, b.size) for i, b in info.bars.items()} == {0: (BAR0, SIZE)}
    res = sysfs / "bus/pci/devices" / BDF / "resource0"
    dev = SysfsDevice(info, {0})
    try:
        dev.write(0, 0x8, 4, 0xDEADBEEF)
        dev.write(0, 0x10, 8, 0x0123456789ABCDEF)
        dev.write(0, 0x1F, 1, 0xA5)
        dev.write(0, 0xFFE, 2, 0xBEEF)
        data = res.read_bytes()
        assert data[0x8:0xC] == struct.pack("<I", 0xDEADBEEF)
        assert data[0x10:0x18] == struct.pack("<Q", 0x0123456789ABCDEF)
        assert data[0x1F] == 0xA5 and data[0xFFE:] == b"\xef\xbe"
        with open(res, "r+b") as fh:
            fh.seek(0x40)
            fh.write(struct.pack("<IHBx", 0x11223344, 0x5566, 0x77))
        assert [dev.read(0, 0x40, 4), dev.read(0, 0x44, 2), dev.read(0, 0x46, 1),
                dev.read(0, 0x40, 8)] == [0x11223344, 0x5566, 0x77, 0x0077556611223344]
        for bad in ((0, 0xFFD, 4), (0, SIZE, 1), (0, -4, 4), (0, 0, 3), (2, 0, 4)):
            with pytest.raises(DeviceError):
                dev.read(*bad)
        with pytest.raises(DeviceError):
            dev.write(0, 0, 2, 0x10000)
        assert len(res.read_bytes()) == SIZE
    finally:
        dev.close()


def test_the_sysfs_layer_maps_only_memory_bars_of_the_device(tmp_path):
    root = tmp_path / "sys"
    make_sysfs(root)
    info = describe(BDF, root)
    with pytest.raises(DeviceError, match="has no memory BAR 1"):
        SysfsDevice(info, {0, 1})
    with pytest.raises(DeviceError, match="no PCI device 0000:00:06.0"):
        describe("00:06.0", root)


# --- bisect, through the resource file ----------------------------------------------

BISECT = [
    "VERSION 20070824\n",
    PCIDEV,
    "MAP 1.000000 1 0xfea00000 0xffffc90000100000 0x1000 0x0 0\n",
    "W 4 1.000100 1 0xfea00004 0x1 0x0 7\n",
    "R 4 1.000150 1 0xfea00000 0x0 0x0 7\n",
    "W 4 1.000200 1 0xfea00080 0x5eed 0x0 7\n",         # line 6: the one
    "W 4 1.000300 1 0xfea00004 0x2 0x0 7\n",
    "UNMAP 1.000900 1 0x0 0\n",
]


def check_command(sysfs: Path, value: str) -> str:
    res = sysfs / "bus/pci/devices" / BDF / "resource0"
    return f"test \"$(od -An -tx4 -j128 -N4 {res} | tr -d ' ')\" = {value}"


def reset_command(sysfs: Path) -> str:
    res = sysfs / "bus/pci/devices" / BDF / "resource0"
    return f"dd if=/dev/zero of={res} bs=4096 count=1 conv=notrunc status=none"


@pytest.mark.parametrize("reset", [False, True])
def test_bisect_finds_the_write(reset, sysfs, tmp_path, capsys):
    argv = [write_trace(tmp_path, BISECT), "--pci", BDF, "--bisect",
            "--check", check_command(sysfs, "00005eed")]
    if reset:
        argv += ["--reset", reset_command(sysfs)]
    status, out, err = replay(argv, sysfs, None, capsys)
    assert status == 0, err
    assert out == ("line 6: W 4 0xfea00080 0x5eed: write 2 of 3, the last of the shortest "
                   "prefix after which the check succeeds\n")


@pytest.mark.parametrize("reset", [False, True])
def test_bisect_when_no_prefix_makes_the_check_succeed(reset, sysfs, tmp_path, capsys):
    argv = [write_trace(tmp_path, BISECT), "--pci", BDF, "--bisect",
            "--check", check_command(sysfs, "00005eee")]
    if reset:
        argv += ["--reset", reset_command(sysfs)]
    status, out, err = replay(argv, sysfs, None, capsys)
    assert (status, out) == (1, "")
    assert err.endswith("the check fails after all 3 writes\n") or \
        err.endswith("the check still fails after all 3 writes\n")


@pytest.mark.parametrize("argv,said", [
    (["--bisect"], "--bisect needs --check CMD"),
    (["--check", "true"], "--check and --reset go with --bisect"),
    (["--bisect", "--check", "true", "-o", "x"], "--bisect writes no trace"),
    (["--bisect", "--check", "/nonexistent/cmd"], "cannot run the check command"),
])
def test_bisect_usage(argv, said, sysfs, tmp_path, capsys):
    status, stdout, err = replay([write_trace(tmp_path, BISECT), "--pci", BDF, *argv], sysfs,
                                 None, capsys)
    if "/nonexistent/cmd" in argv:      # sh says it too, on the line before
        err = err.split("\n", 1)[1]
    one_line_refusal(status, stdout, err, said)


# --- polls -------------------------------------------------------------------------


def reads(values: list[int]) -> list[Step]:
    return [Step("R", n, bar=0, offset=0x20, width=4, value=v, first_line=n)
            for n, v in enumerate(values, 1)]


def test_runs_of_reads_of_one_register_become_polls():
    # all alike but the last: one poll; a second change ends it
    steps = fold_polls(reads([1, 1, 1, 0, 0, 5, 7, 9]))
    assert [(s.first_line, s.line, s.reads, s.value) for s in steps] == [
        (1, 4, 4, 0), (5, 6, 2, 5), (7, 8, 2, 9)]
    # another register, or a write between, ends a run
    other = reads([1, 1])
    other[1].offset = 0x24
    assert len(fold_polls(other)) == 2
    assert len(fold_polls([*reads([1]), Step("W", 2, bar=0, offset=0x20, width=4),
                           *reads([1])])) == 3
    assert Selection() == Selection(1, None, None, None, False)


def test_keep_timing_keeps_the_recorded_gaps(sysfs, tmp_path, capsys):
    import time

    # 0.15 s between the write and the read, 0.1 s more before the last read
    lines = [TRACE[0], TRACE[1], TRACE[2],
             "W 4 5.000000 1 0xfea00004 0x1 0x0 7\n",
             "R 4 5.150000 1 0xfea00004 0xfffffffe 0x0 7\n",
             "R 4 5.250000 1 0xfea00000 0x10000ed 0x0 7\n"]
    trace = write_trace(tmp_path, lines)
    start = time.monotonic()
    status, _, err = replay([trace, "--pci", BDF, "--keep-timing", "-o", str(tmp_path / "o")],
                            sysfs, FakeEdu(), capsys)
    assert status == 0, err
    assert time.monotonic() - start >= 0.25
    times = [float(line.split(" ")[2]) for line in (tmp_path / "o").read_text().splitlines()
             if line[:2] in ("R ", "W ")]
    assert times[1] - times[0] > 0.149 and times[2] - times[1] > 0.099
