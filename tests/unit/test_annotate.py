"""mmiotrace-ng annotate on traces built here: register names only inside
the BAR of the device a map is for, callers from a recording's kallsyms or a
--kallsyms file, polling folded with the count and duration the trace has,
MAP/UNMAP/MARK/Lost lines, and the folder's bookkeeping (what it folds
expands back to its input, holding back only a few accesses)."""

from __future__ import annotations

import argparse
import random
import re

import pytest

from mmiotrace_ng import cli
from mmiotrace_ng.analysis import annotate
from mmiotrace_ng.common.errors import UsageError
from mmiotrace_ng.format import rawfile
from mmiotrace_ng.format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_WRITE
from mmiotrace_ng.format.records import NgRecAccess, NgRecMap, NgRecType

HEADER = "VERSION 20070824\n"
# 00:06.0, an 82540EM (e1000.regs): BAR0 memory 0xfeb40000 (128 KiB), BAR1 I/O, ROM
E1000 = ("PCIDEV 0030 8086100e 16 feb40000 c081 0 0 0 0 feb00000 "
         "20000 40 0 0 0 0 40000 e1000\n")
# 00:07.0, an 82574L (8086:10d3, e1000e: not in e1000.regs), BAR0 at 0xfe000000
OTHER = "PCIDEV 0038 808610d3 17 fe000000 0 0 0 0 0 0 20000 0 0 0 0 0 0 e1000e\n"
# 00:05.0, QEMU's edu device
EDU = "PCIDEV 0028 123411e8 15 fea00000 0 0 0 0 0 0 100000 0 0 0 0 0 0 edu_exerciser\n"
BAR0, OTHER_BAR0, ROM, EDU_BAR0 = 0xFEB40000, 0xFE000000, 0xFEB00000, 0xFEA00000
STATUS_VALUE = 0x80080783


def ts(us: int) -> str:
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def acc(op: str, us: int, map_id: int, phys: int, value: int, width: int = 4,
        pc: int = 0) -> str:
    return f"{op} {width} {ts(us)} {map_id} 0x{phys:x} 0x{value:x} 0x{pc:x} 0\n"


def mapping(us: int, map_id: int, phys: int, length: int) -> str:
    return f"MAP {ts(us)} {map_id} 0x{phys:x} 0xffffc90000000000 0x{length:x} 0x0 0\n"


def unmapping(us: int, map_id: int) -> str:
    return f"UNMAP {ts(us)} {map_id} 0x0 0\n"


def run(argv: list[str], capsys) -> tuple[int, list[str], str]:
    """annotate's status, its output lines and its stderr."""
    ap = argparse.ArgumentParser(prog="mmiotrace-ng annotate")
    annotate.setup(ap)
    status = annotate.run(ap.parse_args(argv))
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def trace_file(tmp_path, text: str, name: str = "t.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def only(lines: list[str], pattern: str) -> str:
    found = [line for line in lines if re.search(pattern, line)]
    assert len(found) == 1, (pattern, found)
    return found[0]


# --- which accesses get names -------------------------------------------------------


def two_nics() -> str:
    return (HEADER + E1000 + OTHER
            + mapping(10_000_000, 1, BAR0, 0x20000)
            + mapping(10_000_100, 2, OTHER_BAR0, 0x20000)
            + mapping(10_000_200, 3, ROM, 0x40000)
            + mapping(10_000_300, 4, BAR0 + 0x5000, 0x1000)   # part of BAR0
            + acc("R", 10_001_000, 1, BAR0 + 0x8, STATUS_VALUE)
            + acc("R", 10_001_010, 2, OTHER_BAR0 + 0x8, STATUS_VALUE)
            + acc("R", 10_001_020, 3, ROM + 0x8, 0x55AA)
            + acc("W", 10_001_030, 4, BAR0 + 0x5404, 0x80005634)
            + acc("W", 10_001_040, 1, BAR0 + 0x1_FFF0, 0x1))   # in BAR0, in no register


@pytest.mark.parametrize("regs", [[], ["--regs", "e1000"]])
def test_names_only_in_the_bar_of_the_device_the_map_is_for(tmp_path, capsys, regs):
    status, lines, err = run([*regs, trace_file(tmp_path, two_nics())], capsys)
    assert status == 0
    assert "e1000.regs names the registers of 00:06.0 8086:100e BAR0" in err
    assert "00:07.0" not in err
    line = only(lines, r"#1 R 4 ")
    assert re.search(r"#1 R 4 STATUS +0x80080783 \{FD=1 LU=1 SPEED=1000 ASDV=1000 MTXCKOK=1 "
                     r"GIO_MASTER_ENABLE=1 \?=0x80000000\}$", line), line
    # the same offset of the other NIC, and of the e1000's ROM: offsets only
    assert re.search(r"#2 R 4 \+0x0008 +0x80080783$", only(lines, r"#2 R "))
    assert re.search(r"#3 R 4 \+0x0008 +0x55aa$", only(lines, r"#3 R "))
    # a mapping of part of BAR0: named by the offset in the BAR, not in the mapping
    assert re.search(r"#4 W 4 RAH0 +0x80005634 \{RAH=0x5634 AV=1\}$", only(lines, r"#4 W "))
    assert re.search(r"#1 W 4 \+0x1fff0 +0x1$", only(lines, r"#1 W "))
    # the MAP lines say what they map
    assert only(lines, "#1 MAP").endswith(
        "#1 MAP 0xfeb40000 len 0x20000  00:06.0 8086:100e BAR0 (e1000)  regs e1000.regs")
    assert only(lines, "#2 MAP").endswith("#2 MAP 0xfe000000 len 0x20000  00:07.0 8086:10d3 BAR0 "
                                          "(e1000e)")
    assert only(lines, "#3 MAP").endswith("00:06.0 8086:100e ROM (e1000)")
    assert only(lines, "#4 MAP").endswith("00:06.0 8086:100e BAR0+0x5000 (e1000)  regs e1000.regs")
    # and the header lists the devices
    assert only(lines, "^# PCI 00:06.0").startswith(
        "# PCI 00:06.0 8086:100e (e1000): BAR0 0xfeb40000+0x20000 [e1000.regs], "
        "ROM 0xfeb00000+0x40000, BAR1 io 0xc080+0x40")


def test_a_map_for_a_device_not_in_the_trace_names_nothing(tmp_path, capsys):
    status, lines, err = run(["--regs", "edu", trace_file(tmp_path, two_nics())], capsys)
    assert status == 0
    assert "edu.regs not applied: no device 1234:11e8 in the trace" in err
    assert re.search(r"#1 R 4 \+0x0008 +0x80080783$", only(lines, r"#1 R "))
    assert not any("STATUS" in line or "regs " in line for line in lines)


def test_without_a_fitting_shipped_map_stderr_says_so(tmp_path, capsys):
    text = HEADER + OTHER + mapping(1, 1, OTHER_BAR0, 0x20000) + acc("R", 2, 1, OTHER_BAR0, 5)
    status, lines, err = run([trace_file(tmp_path, text)], capsys)
    assert status == 0
    assert "no shipped register map fits a device of this trace" in err
    assert re.search(r"#1 R 4 \+0x0000 +0x5$", lines[-1])


def test_a_map_file_of_ones_own(tmp_path, capsys):
    regs = tmp_path / "nic.regs"
    regs.write_text("device 8086:10d3 bar 0\n0x8 4 MYSTATUS\n  1 UP\n")
    status, lines, err = run(["--regs", str(regs), trace_file(tmp_path, two_nics())], capsys)
    assert status == 0 and "nic.regs names the registers of 00:07.0 8086:10d3 BAR0" in err
    assert re.search(r"#2 R 4 MYSTATUS +0x80080783 \{UP=1 \?=0x80080781\}$",
                     only(lines, "#2 R "))
    assert re.search(r"#1 R 4 \+0x0008 ", only(lines, "#1 R "))


def test_an_access_without_a_bar_shows_its_offset_in_its_mapping(tmp_path, capsys):
    text = (HEADER + mapping(1, 1, 0xFED00000, 0x400) + acc("R", 2, 1, 0xFED000F0, 0x1234)
            + acc("R", 3, 9, 0xFEE00000, 0x1))          # a mapping never seen
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    assert lines[0].endswith("#1 MAP 0xfed00000 len 0x400")
    assert re.search(r"#1 R 4 \+0x00f0 +0x1234$", lines[1])
    assert re.search(r"#9 R 4 0xfee00000 +0x1$", lines[2])


# --- time, folding ---------------------------------------------------------------------


def test_times_and_deltas(tmp_path, capsys):
    text = (HEADER + E1000 + mapping(70_316_360, 1, BAR0, 0x20000)
            + acc("R", 70_316_725, 1, BAR0 + 0x8, STATUS_VALUE)
            + acc("W", 70_316_737, 1, BAR0 + 0xD8, 0xFFFFFFFF)
            + acc("R", 71_000_000, 1, BAR0, 0x40140240))
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    got = [line.split()[:2] for line in lines[1:]]
    assert got == [["70.316360", "+0.000000"], ["70.316725", "+0.000365"],
                   ["70.316737", "+0.000012"], ["71.000000", "+0.683263"]]


def polling(count: int, duration_us: int, start: int = 50_000_000) -> list[str]:
    """count reads of STATUS, the first at start, the last duration_us later."""
    return [acc("R", start + i * duration_us // (count - 1), 1, BAR0 + 0x8, STATUS_VALUE,
                pc=0xFFFFFFFFC0001234) for i in range(count)]


def test_a_polling_loop_is_one_line_with_its_count_and_duration(tmp_path, capsys):
    reads = polling(1200, 3100)
    text = (HEADER + E1000 + mapping(49_000_000, 1, BAR0, 0x20000) + "".join(reads)
            + acc("W", 50_003_150, 1, BAR0 + 0xD8, 0x4))
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    assert len(lines) == 4          # PCI, MAP, the poll, the write
    poll = lines[2]
    assert poll.split()[:2] == ["50.000000", "+1.000000"]
    assert re.search(r"#1 R 4 STATUS +0x80080783 \{FD=1 .*\} \(x1200, 3\.1 ms\)  "
                     r"0xffffffffc0001234$", poll), poll
    # the next line's delta counts from the last read of the loop
    assert lines[3].split()[:2] == ["50.003150", "+0.000050"]
    assert re.search(r"#1 W 4 IMC +0x4 \{LSC=1\}$", lines[3])


def test_what_breaks_a_run(tmp_path, capsys):
    same = dict(map_id=1, phys=BAR0 + 8)
    text = (HEADER + E1000 + mapping(1, 1, BAR0, 0x20000)
            + acc("R", 10, value=1, **same) + acc("R", 20, value=1, **same)     # x2
            + acc("R", 30, value=2, **same)                                    # new value
            + acc("R", 40, value=2, pc=0x10, **same)                            # new caller
            + acc("R", 50, value=2, pc=0x10, width=2, **same)                   # new width
            + acc("R", 60, value=2, pc=0x10, width=2, **same)
            + "MARK 0.000070 between\n"
            + acc("R", 80, value=2, pc=0x10, width=2, **same))                  # after a MARK
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    body = [line.split(None, 2)[2] for line in lines[2:]]
    fd, lu = "{FD=1 SPEED=10 ASDV=10}", "{LU=1 SPEED=10 ASDV=10}"
    assert [re.sub(r" {2,}", " ", b) for b in body] == [
        f"#1 R 4 STATUS 0x1 {fd} (x2, 10 us)",
        f"#1 R 4 STATUS 0x2 {lu}",
        f"#1 R 4 STATUS 0x2 {lu} 0x10",
        f"#1 R 2 STATUS 0x2 {lu} (x2, 10 us) 0x10",
        "MARK between",
        f"#1 R 2 STATUS 0x2 {lu} 0x10"]


def handshake(rounds: int, start: int = 1000) -> list[str]:
    """write CTRL then read STATUS, `rounds` times, 7 and 3 us apart."""
    out = []
    for i in range(rounds):
        out.append(acc("W", start + 10 * i, 1, BAR0, 0x40))
        out.append(acc("R", start + 10 * i + 7, 1, BAR0 + 8, STATUS_VALUE))
    return out


def test_a_repeated_cycle_is_shown_once_with_its_count(tmp_path, capsys):
    text = (HEADER + E1000 + mapping(1, 1, BAR0, 0x20000) + "".join(handshake(5))
            + acc("R", 2000, 1, BAR0 + 0x10, 0x188))
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    assert len(lines) == 6
    assert re.search(r"^ +0\.001000 +\+0\.000999 \| #1 W 4 CTRL +0x40 \{SLU=1\}$", lines[2])
    assert re.search(r"^ +0\.001007 +\+0\.000007 \| #1 R 4 STATUS +0x80080783 ", lines[3])
    # from the first write to the last read: 4 rounds of 10 us and 7 us
    assert re.fullmatch(r" +'-- these 2 accesses x5 \(47 us\)", lines[4]), lines[4]
    assert lines[5].split()[:2] == ["0.002000", "+0.000953"]


def test_two_rounds_of_a_cycle_are_not_folded(tmp_path, capsys):
    text = HEADER + E1000 + mapping(1, 1, BAR0, 0x20000) + "".join(handshake(2))
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    assert len(lines) == 6 and not any("'--" in line or "| " in line for line in lines)
    assert [line.split()[0] for line in lines[2:]] == ["0.001000", "0.001007", "0.001010",
                                                       "0.001017"]


def test_fold_option(tmp_path, capsys):
    text = (HEADER + E1000 + mapping(1, 1, BAR0, 0x20000) + "".join(handshake(5))
            + "".join(polling(10, 90)))
    path = trace_file(tmp_path, text)
    _, lines, _ = run(["--fold", "1", path], capsys)     # runs only
    assert len(lines) == 2 + 10 + 1 and "(x10, 90 us)" in lines[-1]
    _, lines, _ = run(["--fold", "0", path], capsys)     # nothing
    assert len(lines) == 2 + 10 + 10


class Recorder:
    """What a Folder emits, expanded back to the events it stands for."""

    def __init__(self) -> None:
        self.events: list[annotate.Event] = []
        self.folds: list[tuple[int, int]] = []       # (length of the cycle, rounds)

    def one(self, ev):
        self.events.append(ev)

    def run(self, ev, count, last):
        self.folds.append((1, count))
        self.events += [ev] * count

    def cycle(self, evs, count, last):
        self.folds.append((len(evs), count))
        self.events += evs * count


def event(key: int, t: int) -> annotate.Event:
    from mmiotrace_ng.analysis.tracefile import Access

    return annotate.Event(Access("R", 0, 1, key, 4, key), t)


@pytest.mark.parametrize("longest", [1, 2, 3, 4])
def test_the_folder_gives_back_its_input_and_holds_little(longest):
    rng = random.Random(longest)
    for _ in range(200):
        # a few kinds of access, in runs and cycles and noise
        seq: list[int] = []
        while len(seq) < 120:
            pattern = [rng.randrange(4) for _ in range(rng.randint(1, 5))]
            seq += pattern * rng.randint(1, 6)
        rec = Recorder()
        folder = annotate.Folder(longest, rec.one, rec.run, rec.cycle)
        for t, k in enumerate(seq):
            folder.push(event(k, t))
            held = len(folder.held) + len(folder.early) + len(folder.partial)
            assert held <= 3 * longest, held
        folder.flush()
        assert [e.key[3] for e in rec.events] == seq
        assert all(n <= longest and (n == 1 or count >= annotate.MIN_CYCLE_ROUNDS)
                   for n, count in rec.folds)


# --- callers ---------------------------------------------------------------------------

KALLSYMS = ("ffffffff81000000 T _stext\n"
            "ffffffffc0400000 t edu_probe\t[edu_exerciser]\n"
            "ffffffffc0400100 t edu_remove\t[edu_exerciser]\n"
            "ffffffffc0400180 d edu_data\t[edu_exerciser]\n")


def access_record(t_ns: int, op: int, phys: int, value: int, ip: int) -> NgRecAccess:
    rec = NgRecAccess(phys=phys, value=value, compat_value=value, map_id=1, ip=ip)
    rec.hdr.type, rec.hdr.ts_ns = NgRecType.NG_REC_ACCESS, t_ns
    rec.op = rec.compat_op = op
    rec.width = rec.compat_width = 4
    return rec


def test_callers_come_from_a_recordings_kallsyms(tmp_path, capsys):
    m = NgRecMap(phys=EDU_BAR0, virt=0xFFFFC90000400000, len=0x100000, map_id=1)
    m.hdr.type, m.hdr.ts_ns = NgRecType.NG_REC_MAP, 5_000_000_000
    recs = [m,
            access_record(5_000_100_000, MMIOTNG_OP_READ, EDU_BAR0, 0x010000ED, 0xFFFFFFFFC0400010),
            access_record(5_000_200_000, MMIOTNG_OP_WRITE, EDU_BAR0 + 4, 7, 0xFFFFFFFFC0400123),
            access_record(5_000_300_000, MMIOTNG_OP_READ, EDU_BAR0 + 4, 0xFFFFFFF8,
                          0xFFFFFFFFC0400190)]      # in data, after the last function
    path = tmp_path / "t.raw"
    w = rawfile.RawWriter(str(path))
    w.meta({})
    w.header(HEADER + EDU)
    w.records([bytes(r) for r in recs])
    w.end(0, 0, KALLSYMS, None)
    w.close()
    status, lines, err = run([str(path)], capsys)
    assert status == 0 and "edu.regs names the registers of 00:05.0 1234:11e8 BAR0" in err
    assert re.search(r"#1 R 4 ID +0x10000ed \{MAJOR=1 MAGIC=0xed\}  edu_probe\+0x10 "
                     r"\[edu_exerciser\]$", lines[2]), lines[2]
    assert re.search(r"#1 W 4 LIVENESS +0x7  edu_remove\+0x23 \[edu_exerciser\]$", lines[3])
    assert re.search(r"#1 R 4 LIVENESS +0xfffffff8  0xffffffffc0400190$", lines[4])


def test_callers_of_a_text_trace_from_a_kallsyms_file(tmp_path, capsys):
    text = (HEADER + EDU + mapping(1, 1, EDU_BAR0, 0x100000)
            + acc("R", 2, 1, EDU_BAR0 + 0x20, 0x1, pc=0xFFFFFFFF81000040)
            + acc("R", 3, 1, EDU_BAR0 + 0x24, 0x0))
    path = trace_file(tmp_path, text)
    syms = tmp_path / "kallsyms"
    syms.write_text(KALLSYMS)
    _, lines, _ = run(["--kallsyms", str(syms), path], capsys)
    assert re.search(r"#1 R 4 STATUS +0x1 \{COMPUTING=1\}  _stext\+0x40$", lines[2]), lines[2]
    assert re.search(r"#1 R 4 IRQ_STATUS +0x0$", lines[3])     # no pc: no caller
    _, lines, _ = run([path], capsys)
    assert re.search(r"#1 R 4 STATUS +0x1 \{COMPUTING=1\}  0xffffffff81000040$", lines[2])
    syms.write_text("0000000000000000 T _stext\n")
    with pytest.raises(UsageError, match="shows no addresses"):
        run(["--kallsyms", str(syms), path], capsys)


# --- the other lines ---------------------------------------------------------------------


def test_unmap_mark_and_lost_lines(tmp_path, capsys):
    text = (HEADER + E1000 + mapping(1_000_000, 1, BAR0, 0x20000)
            + acc("R", 1_000_010, 1, BAR0 + 8, 2)
            + "MARK 0.000000 Lost 7 events.\n"
            + acc("R", 1_000_500, 1, BAR0 + 8, 2)
            + "MARK 1.000600 driver loaded\n"
            + unmapping(1_000_700, 1))
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    assert "*** LOST 7 EVENTS: the trace has a gap here ***" in lines[3]
    assert not re.search(r"\d\.\d{6}", lines[3])
    # the lost line has no time: the delta after it counts from the access before
    assert lines[4].split()[:2] == ["1.000500", "+0.000490"]
    assert lines[5].split() == ["1.000600", "+0.000100", "MARK", "driver", "loaded"]
    assert lines[6].split()[:3] == ["1.000700", "+0.000100", "#1"]
    assert lines[6].endswith("#1 UNMAP  0xfeb40000 len 0x20000  00:06.0 8086:100e BAR0")


def test_a_second_stream_starts_afresh(tmp_path, capsys):
    text = (HEADER + E1000 + mapping(1, 1, BAR0, 0x20000) + acc("R", 2, 1, BAR0 + 8, 1)
            + HEADER + OTHER + mapping(3, 1, OTHER_BAR0, 0x20000)
            + acc("R", 4, 1, OTHER_BAR0 + 8, 1))
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    assert re.search(r"#1 R 4 STATUS ", lines[2])
    assert lines[3] == "# --- a new trace starts here (VERSION 20070824) ---"
    assert re.search(r"#1 R 4 \+0x0008 ", lines[-1])
    assert lines[-1].split()[:2] == ["0.000004", "+0.000001"]


def test_unparsed_lines_are_kept(tmp_path, capsys):
    _, lines, _ = run([trace_file(tmp_path, HEADER + "# a comment\nnonsense here\n")], capsys)
    assert lines == ["# a comment", "?? nonsense here"]


def test_bad_input_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(UsageError, match="cannot read"):
        run([str(tmp_path / "absent.txt")], capsys)
    with pytest.raises(UsageError, match="no register map 'nosuch'"):
        run(["--regs", "nosuch", trace_file(tmp_path, HEADER)], capsys)


def test_the_subcommand_is_wired_to_this_module(tmp_path, capsys):
    cmd = cli.SUBCOMMANDS["annotate"]
    ap = argparse.ArgumentParser()
    cmd.setup(ap)
    out = tmp_path / "out.txt"
    args = ap.parse_args(["-o", str(out), trace_file(tmp_path, two_nics())])
    assert cmd.run(args) == 0
    assert "STATUS" in out.read_text()


def test_the_annotator_streams(capsys):
    """Lines come out as they are fed (a poll held back at most), whatever
    the length of the trace."""
    ann = annotate.Annotator([], fold=4)
    ann.feed(HEADER)
    ann.feed(mapping(1, 1, BAR0, 0x20000))
    assert len(ann.take()) == 1
    for i in range(100_000):
        ann.feed(acc("R", 10 + i, 1, BAR0 + 4 * (i % 7), i))
        assert len(ann.out) <= 1
        ann.take()
    assert len(ann._texts) <= annotate.CACHE_LIMIT


def test_width_of_a_byte_read_in_a_register(tmp_path, capsys):
    text = HEADER + E1000 + mapping(1, 1, BAR0, 0x20000) + acc("R", 2, 1, BAR0 + 9, 0x7,
                                                                  width=1)
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    # bits 15..8 of STATUS: ASDV (9:8) = 3 and MTXCKOK (10)
    assert re.search(r"#1 R 1 STATUS\+1 +0x7 \{ASDV=1000 MTXCKOK=1\}$", lines[2]), lines[2]



class ShortWriter:
    """A stream that takes at most 5 bytes a call, then fails, as a
    BufferedWriter does when the pipe's reader goes away mid-write."""

    def __init__(self, fail_after: int) -> None:
        self.got = b""
        self.fail_after = fail_after

    def write(self, data) -> int:
        if len(self.got) >= self.fail_after:
            raise BrokenPipeError(32, "Broken pipe")
        self.got += bytes(data[:5])
        return min(5, len(data))


def test_a_short_write_is_retried_until_it_fails():
    w = ShortWriter(100)
    annotate._write_all(w, b"0123456789abc")
    assert w.got == b"0123456789abc"
    w = ShortWriter(5)
    with pytest.raises(BrokenPipeError):
        annotate._write_all(w, b"0123456789abc")


def test_an_unknown_access_is_named_too(tmp_path, capsys):
    text = (HEADER + E1000 + mapping(1, 1, BAR0, 0x20000)
            + f"UNKNOWN {ts(2)} 1 0x{BAR0 + 0xC0:x} f3,a5,00 0xffffffff81000010 0\n"
            + f"UNKNOWN {ts(3)} 1 0x{BAR0 + 0x1FFF0:x} f3,a5,00 0x0 0\n")
    _, lines, _ = run([trace_file(tmp_path, text)], capsys)
    assert lines[2].endswith("#1 UNKNOWN ICR insn f3,a5,00  0xffffffff81000010")
    assert lines[3].endswith("#1 UNKNOWN +0x1fff0 insn f3,a5,00")


def test_interrupts_and_dma_mappings_interleaved(tmp_path, capsys):
    """--irq/--dma MARK lines become lines of their own (a handler's exit
    with how long it ran); a register written with a live mapping's bus
    address (or one inside it) says so, one written after the unmap does
    not."""
    lines = [HEADER, EDU, mapping(1_000_000, 1, EDU_BAR0, 0x100000),
             f"MARK {ts(1_000_100)} dma map 0000:00:05.0 0x1f3a000 4096 to-device\n",
             acc("W", 1_003_100, 1, EDU_BAR0 + 0x80, 0x1F3A000, width=8),
             acc("W", 1_003_200, 1, EDU_BAR0 + 0x88, 0x1F3A800, width=8),
             acc("W", 1_004_000, 1, EDU_BAR0 + 0x60, 1),
             f"MARK {ts(1_004_010)} irq 24 0000:00:05.0 enter edu_exerciser\n",
             acc("R", 1_004_020, 1, EDU_BAR0 + 0x24, 1),
             f"MARK {ts(1_004_022)} irq 24 0000:00:05.0 exit handled\n",
             f"MARK {ts(1_005_000)} dma unmap 0000:00:05.0 0x1f3a000 4096 to-device\n",
             acc("W", 1_006_000, 1, EDU_BAR0 + 0x80, 0x1F3A000, width=8),
             unmapping(1_007_000, 1)]
    status, out, err = run([trace_file(tmp_path, "".join(lines)), "--fold", "0"], capsys)
    assert status == 0
    assert only(out, r"DMA 0x1f3a000 .*\(map").endswith(
        "DMA 0x1f3a000 to-device 4096 bytes (map, 0000:00:05.0)")
    writes = [ln for ln in out if "0x1f3a" in ln and " W " in ln]
    assert len(writes) == 3, out
    assert writes[0].endswith("= DMA to-device 4096 bytes mapped 3.0 ms before"), writes
    assert writes[1].endswith("= +0x800 of DMA to-device 4096 bytes mapped 3.1 ms before")
    assert "DMA" not in writes[2].split("0x1f3a000", 1)[1]
    assert only(out, r"IRQ 24 edu_exerciser").endswith("IRQ 24 edu_exerciser (0000:00:05.0)")
    assert only(out, r"IRQ 24 handled").endswith("IRQ 24 handled, 12 us after its entry")
    assert not [ln for ln in out if "MARK" in ln], out
