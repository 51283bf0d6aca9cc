"""mmiotrace-ng diff: traces built from one list of events, as two boots (or a
recording and its text) give them, so the right answer is known by
construction: what the events share is equal, what was changed differs."""

from __future__ import annotations

import ctypes
import io
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mmiotrace_ng import cli
from mmiotrace_ng.analysis import diff
from mmiotrace_ng.format import rawfile
from mmiotrace_ng.format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_UNKNOWN, MMIOTNG_OP_WRITE
from mmiotrace_ng.format.records import NgRecAccess, NgRecMap, NgRecMark, NgRecType, NgRecUnmap
from mmiotrace_ng.format.render import Renderer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from diff_bench import synthetic_lines  # noqa: E402

BAR = 0xFEB4_0000
BAR2 = 0xFEA0_0000
LEN = 0x20000
PCIDEV = "PCIDEV 0030 8086100e 16 feb40000 c081 0 0 0 0 feb00000 20000 40 0 0 0 0 40000 "


@dataclass
class Boot:
    """How one boot prints the same events: its own clock, map ids, virtual
    addresses, instruction addresses and pid."""

    first_id: int = 1
    ts_ns: int = 25_000_000_000
    pc: int = 0
    pid: int = 0
    virt: int = 0xFFFF_C900_0060_0000
    step: int = 1
    ids: dict[int, int] = field(default_factory=dict)      # phys of a mapping -> map id
    lens: dict[int, int] = field(default_factory=dict)

    def _tick(self) -> str:
        self.ts_ns += 1000 * self.step + 17_000
        usecs = (self.ts_ns + 500) // 1000
        return f"{usecs // 10**6}.{usecs % 10**6:06d}"

    def _id(self, phys: int) -> int:
        found = [(base, i) for base, i in self.ids.items() if base <= phys < base + self.lens[base]]
        return max(found)[1] if found else -1

    def text(self, events: list[tuple]) -> list[str]:
        """The 20070824 lines of events."""
        out = ["VERSION 20070824\n"]
        n_maps = 0
        for ev in events:
            kind = ev[0]
            if kind == "PCIDEV":
                out.append(ev[1] + "\n")
            elif kind == "MAP":
                _, phys, length = ev
                self.ids[phys], self.lens[phys] = self.first_id + n_maps, length
                out.append(f"MAP {self._tick()} {self.ids[phys]} 0x{phys:x} "
                           f"0x{self.virt + n_maps * 0x100000:x} 0x{length:x} 0x0 0\n")
                n_maps += 1
            elif kind == "UNMAP":
                out.append(f"UNMAP {self._tick()} {self.ids.pop(ev[1])} 0x0 0\n")
            elif kind in ("R", "W"):
                _, phys, value, *width = ev
                out.append(f"{kind} {width[0] if width else 4} {self._tick()} {self._id(phys)} "
                           f"0x{phys:x} 0x{value:x} 0x{self.pc + phys % 251:x} {self.pid}\n")
            elif kind == "UNKNOWN":
                out.append(f"UNKNOWN {self._tick()} {self._id(ev[1])} 0x{ev[1]:x} f3,a5,00 "
                           f"0x{self.pc:x} {self.pid}\n")
            elif kind == "MARK":
                out.append(f"MARK {self._tick()} {ev[1]}\n")
            elif kind == "LOST":
                out.append(f"MARK 0.000000 Lost {ev[1]} events.\n")
        return out

    def records(self, events: list[tuple]) -> list[bytes]:
        """The binary records of events (R/W/UNKNOWN, MAP, UNMAP, MARK), as
        the tracer writes them into a recording."""
        out = []
        n_maps = 0
        for ev in events:
            kind = ev[0]
            self._tick()
            if kind == "MAP":
                _, phys, length = ev
                self.ids[phys], self.lens[phys] = self.first_id + n_maps, length
                rec = NgRecMap(phys=phys, virt=self.virt + n_maps * 0x100000, len=length,
                               map_id=self.ids[phys], pid=self.pid)
                rec.hdr.type = NgRecType.NG_REC_MAP
                n_maps += 1
            elif kind == "UNMAP":
                rec = NgRecUnmap(map_id=self.ids.pop(ev[1]), virt=self.virt)
                rec.hdr.type = NgRecType.NG_REC_UNMAP
            elif kind in ("R", "W", "UNKNOWN"):
                phys, value = ev[1], (ev[2] if kind != "UNKNOWN" else 0)
                width = ev[3] if len(ev) > 3 else 4
                op = {"R": MMIOTNG_OP_READ, "W": MMIOTNG_OP_WRITE,
                      "UNKNOWN": MMIOTNG_OP_UNKNOWN}[kind]
                rec = NgRecAccess(phys=phys, value=value, compat_value=value,
                                  ip=self.pc + phys % 251, map_id=self._id(phys), pid=self.pid,
                                  width=width, op=op, compat_width=width, compat_op=op,
                                  insn_len=2)
                rec.insn[0], rec.insn[1], rec.insn[2] = 0xF3, 0xA5, 0
                rec.hdr.type = NgRecType.NG_REC_ACCESS
            elif kind == "MARK":
                text = ev[1].encode() + b"\n"
                rec = NgRecMark(len=len(text))
                ctypes.memmove(ctypes.addressof(rec) + NgRecMark.text.offset, text, len(text))
                rec.hdr.type = NgRecType.NG_REC_MARK
                rec.hdr.ts_ns = self.ts_ns
                out.append(bytes(rec)[:NgRecMark.text.offset + len(text)])
                continue
            else:
                continue
            rec.hdr.ts_ns = self.ts_ns
            out.append(bytes(rec))
        return out


BOOT_B = dict(first_id=7, ts_ns=91_123_456_789, pc=0xFFFF_FFFF_C05A_0000, pid=321,
              virt=0xFFFF_A000_1234_0000, step=3)


def accesses(n: int, base: int = BAR, seed: int = 1) -> list[tuple]:
    """n accesses, no two neighbours alike (so nothing folds)."""
    rng = random.Random(seed)
    return [("R" if i % 3 else "W", base + 4 * (i % 97), rng.getrandbits(32)) for i in range(n)]


def scenario(n: int = 40, seed: int = 1) -> list[tuple]:
    return [("PCIDEV", PCIDEV), ("MAP", BAR, LEN), *accesses(n, seed=seed), ("UNMAP", BAR)]


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(lines))
    return str(path)


def write_recording(path: Path, recs: list[bytes], header: str = "VERSION 20070824\n",
                    pending: int = 0) -> str:
    w = rawfile.RawWriter(str(path))
    w.header(header)
    w.records(recs)
    w.end(pending, pending, None, None)
    w.close()
    return str(path)


def run_diff(capsysbinary, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of mmiotrace-ng diff argv, argparse's exits included."""
    try:
        status = cli.main(["diff", *argv])
    except SystemExit as exc:
        status = exc.code
    cap = capsysbinary.readouterr()
    return status, cap.out.decode(), cap.err.decode()


def pair(tmp_path: Path, events_a: list[tuple], events_b: list[tuple]) -> tuple[str, str]:
    return (write(tmp_path / "a.txt", Boot().text(events_a)),
            write(tmp_path / "b.txt", Boot(**BOOT_B).text(events_b)))


def hunks(out: str) -> list[list[str]]:
    """The hunks of a unified diff, each as its lines (header first)."""
    found: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("@@"):
            found.append([line])
        elif found:
            found[-1].append(line)
    return found


def sides(hunk: list[str]) -> tuple[list[str], list[str]]:
    """What a hunk says A and B hold there (context and - lines, context and + lines)."""
    a = [x[1:] for x in hunk[1:] if x[:1] in " -"]
    b = [x[1:] for x in hunk[1:] if x[:1] in " +"]
    return a, b


def show(ev: tuple) -> str:
    return f"{ev[0]} {ev[3] if len(ev) > 3 else 4} 0x{ev[1]:x} 0x{ev[2]:x}"


# --- what is ignored, what is not -------------------------------------------


def test_two_boots_of_one_scenario_are_equal(tmp_path, capsysbinary):
    events = scenario(200) + [("MARK", "up"), ("MAP", BAR2, 0x1000), ("R", BAR2 + 8, 5),
                              ("UNMAP", BAR2)]
    a, b = pair(tmp_path, events, events)
    assert open(a).read() != open(b).read()
    assert run_diff(capsysbinary, a, b) == (0, "", "")


def test_one_changed_write_is_one_hunk(tmp_path, capsysbinary):
    events = scenario(40)
    changed = list(events)
    i = 2 + 21                          # the 22nd access (a write: 21 % 3 == 0)
    assert changed[i][0] == "W"
    changed[i] = ("W", changed[i][1], 0x1234)
    a, b = pair(tmp_path, events, changed)
    status, out, err = run_diff(capsysbinary, a, b)
    assert (status, err) == (1, "")
    assert out.startswith(f"--- {a}\n+++ {b}\n")
    # records: 1 VERSION, 2 PCIDEV, 3 MAP, 4.. the accesses: the change is record 25
    ctx = [show(ev) for ev in events[i - 3:i] + events[i + 1:i + 4]]
    assert hunks(out) == [[
        f"@@ -22,7 +22,7 @@ MAP 0x{BAR:x} 0x{LEN:x}",
        *(" " + c for c in ctx[:3]), "-" + show(events[i]), "+" + show(changed[i]),
        *(" " + c for c in ctx[3:])]]


def test_unmap_is_compared_by_mapping(tmp_path, capsysbinary):
    """Two mappings unmapped in the other order differ by their UNMAP lines,
    whatever the map ids; a change in the second mapping is headed by it."""
    first = [("MAP", BAR, LEN), ("MAP", BAR2, 0x1000), ("R", BAR + 4, 1), ("R", BAR2 + 4, 2)]
    a = first + [("UNMAP", BAR), ("UNMAP", BAR2)]
    b = first + [("UNMAP", BAR2), ("UNMAP", BAR)]
    assert run_diff(capsysbinary, *pair(tmp_path, a, a)) == (0, "", "")
    status, out, _ = run_diff(capsysbinary, *pair(tmp_path, a, b))
    assert status == 1
    (h,) = hunks(out)
    unmap, unmap2 = f"UNMAP 0x{BAR:x} 0x{LEN:x}", f"UNMAP 0x{BAR2:x} 0x1000"
    context = [f"MAP 0x{BAR2:x} 0x1000", f"R 4 0x{BAR + 4:x} 0x1", f"R 4 0x{BAR2 + 4:x} 0x2"]
    assert sides(h) == (context + [unmap, unmap2], context + [unmap2, unmap])
    # records 3.. of each side; no access changed: no MAP after the @@
    assert re.fullmatch(r"@@ -3,\d \+3,\d @@", h[0])
    assert [x for x in h if x[:1] in "+-"] in (["-" + unmap, "+" + unmap],
                                                ["+" + unmap2, "-" + unmap2])
    second = first[:3] + [("R", BAR2 + 4, 3)]
    status, out, _ = run_diff(capsysbinary, *pair(tmp_path, first, second))
    assert status == 1 and hunks(out)[0][0].endswith(f" @@ MAP 0x{BAR2:x} 0x1000")
    one = first[:2] + [("R", BAR + 4, 3)] + first[3:]
    status, out, _ = run_diff(capsysbinary, *pair(tmp_path, first, one))
    assert status == 1 and hunks(out)[0][0].endswith(f" @@ MAP 0x{BAR:x} 0x{LEN:x}")


def test_header_lines_count_unless_ignored(tmp_path, capsysbinary):
    other = PCIDEV.replace("feb40000", "fe840000")
    a, b = pair(tmp_path, scenario(10), [("PCIDEV", other), *scenario(10)[1:]])
    status, out, _ = run_diff(capsysbinary, a, b)
    assert status == 1
    assert [x for x in out.splitlines() if x[:1] in "+-"][2:] == ["-" + PCIDEV, "+" + other]
    assert run_diff(capsysbinary, "--ignore-header", a, b) == (0, "", "")


def test_comments_and_empty_lines_are_skipped(tmp_path, capsysbinary):
    lines = Boot().text(scenario(10))
    a = write(tmp_path / "a.txt", ["# tracer: mmiotrace\n", "#\n", *lines[:5], "\n", *lines[5:]])
    b = write(tmp_path / "b.txt", Boot(**BOOT_B).text(scenario(10)))
    assert run_diff(capsysbinary, a, b) == (0, "", "")


def test_lines_without_pc_and_pid(tmp_path, capsysbinary):
    """R/W lines cut after the value (as some tools keep them) compare with
    full ones, --ignore-value included."""
    events = [("MAP", BAR, LEN), *accesses(20), ("R", BAR + 0x2800, 1), *accesses(3, seed=2)]
    short = [" ".join(x.split(" ")[:6]) + "\n" if x[:2] in ("R ", "W ") else x
             for x in Boot(**BOOT_B).text(events)]
    b = write(tmp_path / "b.txt", short)
    a = write(tmp_path / "a.txt", Boot().text(events))
    assert run_diff(capsysbinary, a, b) == (0, "", "")
    events[21] = ("R", BAR + 0x2800, 2)
    a = write(tmp_path / "a.txt", Boot().text(events))
    assert run_diff(capsysbinary, a, b)[0] == 1
    assert run_diff(capsysbinary, "--ignore-value", "0x2800", a, b) == (0, "", "")
    assert run_diff(capsysbinary, "--ignore-value", "0x2804", a, b)[0] == 1


def test_untraced_marks_without_their_virtual_address(tmp_path, capsysbinary):
    def mark(virt: int) -> tuple:
        return ("MARK", f"mmiotrace-ng: ioremap of 0x{BAR2:x} size 0x1000 at 0x{virt:x} "
                        "is NOT traced: it is not inside one traced BAR")

    a, b = pair(tmp_path, scenario(5) + [mark(0xFFFFC90000123000)],
                scenario(5) + [mark(0xFFFFC900AB000000)])
    assert run_diff(capsysbinary, a, b) == (0, "", "")


@pytest.mark.parametrize("gap,n_hunks", [(6, 1), (7, 2), (8, 2), (9, 2)])
def test_hunks_apart_by_more_than_twice_the_context(tmp_path, capsysbinary, gap, n_hunks):
    """As diff -u: two changes with at most 2*3 equal records between them
    share a hunk; further apart, each hunk has its 3 lines of context."""
    events = [("MAP", BAR, LEN), *accesses(40)]
    changed = list(events)
    for i in (10, 10 + gap + 1):
        changed[i] = ("W", changed[i][1], 0xBAD)
    status, out, _ = run_diff(capsysbinary, *pair(tmp_path, events, changed))
    assert status == 1
    got = hunks(out)
    assert len(got) == n_hunks
    for h in got:
        a, b = sides(h)
        lines = [line[1:] for line in h[1:]]
        assert lines[:3] == a[:3] == b[:3] and lines[-3:] == a[-3:] == b[-3:]
        assert all(line[:1] == " " for line in h[1:4] + h[-3:])
    # the records between the hunks: each is in exactly one hunk or in none
    shown = [x for h in got for x in h[1:] if x[:1] == " "]
    assert len(shown) == (gap + 6 if n_hunks == 1 else 12)


# --- resynchronization ---------------------------------------------------------


def test_insertion_and_deletion_in_a_long_trace(tmp_path, capsysbinary):
    events = scenario(30_000, seed=5)
    b_events = list(events)
    extra = ("W", BAR + 0x1FFC, 0xDEAD)
    b_events.insert(10_000, extra)          # B has one access more here
    gone = b_events.pop(20_001)             # and one less there
    status, out, _ = run_diff(capsysbinary, *pair(tmp_path, events, b_events))
    assert status == 1
    got = hunks(out)
    assert len(got) == 2
    assert [x for x in got[0] if x[:1] in "+-"] == ["+" + show(extra)]
    assert [x for x in got[1] if x[:1] in "+-"] == ["-" + show(gone)]
    # records: VERSION, PCIDEV, then event k is record k + 2; 3 lines of context
    # event e is record e + 2 (VERSION is record 1): the extra one is B's
    # 10002, the one gone A's 20002 (B's 20003 is A's 20003); 3 of context
    assert got[0][0].startswith("@@ -9999,6 +9999,7 @@")
    assert got[1][0].startswith("@@ -19999,7 +20000,6 @@")


def test_changes_further_apart_than_the_window(tmp_path, capsysbinary):
    """A block of records B does not have, longer than --window: found by the
    wider search for a pure deletion, not shown as everything changed."""
    events = scenario(3000, seed=2)
    block = accesses(700, base=BAR + 0x10000, seed=9)
    a_events = events[:1000] + block + events[1000:]
    status, out, _ = run_diff(capsysbinary, "--window", "100",
                              *pair(tmp_path, a_events, events))
    assert status == 1
    changed = [x for h in hunks(out) for x in h[1:] if x[:1] in "+-"]
    assert changed == ["-" + show(ev) for ev in block]


def test_different_everywhere_stays_bounded(tmp_path, capsysbinary):
    a, b = pair(tmp_path, scenario(5000, seed=1), scenario(6000, seed=2))
    status, out, _ = run_diff(capsysbinary, "--window", "64", a, b)
    assert status == 1
    minus = sum(1 for x in out.splitlines() if x.startswith("-") and not x.startswith("---"))
    plus = sum(1 for x in out.splitlines() if x.startswith("+") and not x.startswith("+++"))
    # everything but VERSION, PCIDEV, MAP and UNMAP (and chance 3-record matches)
    assert 4900 <= minus <= 5001 and 5900 <= plus <= 6001


# --- polling loops, values, context ------------------------------------------


def polls(spins: list[int]) -> list[tuple]:
    events = [("MAP", BAR, LEN)]
    for k, n in enumerate(spins):
        events += [("W", BAR + 0x100, k)] + [("R", BAR + 8, 0x80080783)] * n
    return events


def test_polls_of_other_lengths_are_equal_unless_exact(tmp_path, capsysbinary):
    a, b = pair(tmp_path, polls([5, 1200, 3, 1]), polls([9, 1150, 3, 2]))
    assert run_diff(capsysbinary, a, b) == (0, "", "")
    status, out, _ = run_diff(capsysbinary, "--exact-counts", "-U", "0", a, b)
    assert status == 1
    poll = "R 4 0xfeb40008 0x80080783"
    assert [[x for x in h if x[:1] in "+-"] for h in hunks(out)] == [
        [f"-{poll} (x5)", f"+{poll} (x9)"], [f"-{poll} (x1200)", f"+{poll} (x1150)"],
        [f"-{poll}", f"+{poll} (x2)"]]
    # records: VERSION, MAP, then W, poll, W, poll...: the polls are 4, 6, 10
    assert [h[0].split(" @@")[0] for h in hunks(out)] == [
        "@@ -4 +4", "@@ -6 +6", "@@ -10 +10"]


def test_folded_runs_in_context_show_both_counts(tmp_path, capsysbinary):
    a, b = pair(tmp_path, polls([5, 7]) + [("W", BAR, 1)], polls([6, 7]) + [("W", BAR, 2)])
    status, out, _ = run_diff(capsysbinary, a, b)
    assert status == 1
    assert " R 4 0xfeb40008 0x80080783 (x5 vs x6)" in out.splitlines()
    assert " R 4 0xfeb40008 0x80080783 (x7)" in out.splitlines()


def test_ignore_value_is_an_offset_in_its_mapping(tmp_path, capsysbinary):
    common = [("MAP", BAR, LEN), ("MAP", BAR + 0x2000, 0x1000), ("MAP", BAR2, LEN)]

    def run(v1: int, v2: int, v3: int) -> list[tuple]:
        return common + [("R", BAR + 0x2800, v1), ("W", BAR + 0x10, 1),
                         ("R", BAR2 + 0x2800, v2), ("W", BAR + 0x10, 2),
                         ("R", BAR + 0x4800, v3)]

    # map ids: BAR's mapping is looked up for BAR+0x2800 (the latest one
    # containing it is BAR+0x2000's: offset 0x800 there)
    a, b = pair(tmp_path, run(1, 2, 3), run(11, 12, 3))
    status, _, _ = run_diff(capsysbinary, a, b)
    assert status == 1
    assert run_diff(capsysbinary, "--ignore-value", "0x800", a, b)[0] == 1   # BAR2's differs
    assert run_diff(capsysbinary, "--ignore-value", "0x800",
                    "--ignore-value", "0x2800", a, b) == (0, "", "")
    assert run_diff(capsysbinary, "--ignore-value", "0x800,0x2800", a, b) == (0, "", "")
    status, out, _ = run_diff(capsysbinary, "--ignore-value", "0x2800", a, b)
    assert status == 1
    assert [x for x in out.splitlines()[2:] if x[:1] in "+-"] == [
        "-R 4 0xfeb42800 0x1", "+R 4 0xfeb42800 0xb"]
    assert " R 4 0xfea02800 *" in out.splitlines()
    a, b = pair(tmp_path, run(1, 2, 3), run(1, 2, 4))           # a value not ignored
    assert run_diff(capsysbinary, "--ignore-value", "0x800,0x2800", a, b)[0] == 1


def test_context_lines_option(tmp_path, capsysbinary):
    events = scenario(40)
    changed = list(events)
    changed[20] = ("R", changed[20][1], 7)
    a, b = pair(tmp_path, events, changed)
    for n in (0, 1, 5):
        status, out, _ = run_diff(capsysbinary, "-U", str(n), a, b)
        (h,) = hunks(out)
        assert status == 1 and len(h) == 1 + 2 * n + 2
    assert run_diff(capsysbinary, "-q", a, b) == (1, f"Traces {a} and {b} differ\n", "")


# --- sections ----------------------------------------------------------------


def sections(names: list[str], changed: str = "") -> list[tuple]:
    events: list[tuple] = [("MAP", BAR, LEN)]
    for name in names:
        seed = sum(map(ord, name))
        acc = accesses(30, seed=seed)
        if name == changed:
            acc[10] = (acc[10][0], acc[10][1], 0xC0FFEE)
        events += [("MARK", name), *acc]
    return events


def test_by_marker_section_missing(tmp_path, capsysbinary):
    a, b = pair(tmp_path, sections(["probe", "reset", "up", "down"]),
                sections(["probe", "up", "down", "extra"], changed="down"))
    status, out, _ = run_diff(capsysbinary, "--by-marker", "-U", "0", a, b)
    assert status == 1
    changed = [[x for x in h if x[:1] in "+-"] for h in hunks(out)]
    reset = ["-MARK reset", *("-" + show(ev) for ev in accesses(30, seed=sum(map(ord, "reset"))))]
    down = accesses(30, seed=sum(map(ord, "down")))
    extra = ["+MARK extra", *("+" + show(ev) for ev in accesses(30, seed=sum(map(ord, "extra"))))]
    assert changed == [reset, ["-" + show(down[10]),
                               "+" + show((down[10][0], down[10][1], 0xC0FFEE))], extra]
    assert run_diff(capsysbinary, "--by-marker", *pair(tmp_path, sections(["x", "y"]),
                                                       sections(["x", "y"]))) == (0, "", "")


def test_standard_input(tmp_path, capsysbinary, monkeypatch):
    a, b = pair(tmp_path, scenario(50), scenario(50))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(open(b, "rb").read())))
    assert run_diff(capsysbinary, "-", a) == (0, "", "")
    changed = scenario(50)
    changed[30] = ("R", BAR + 0x44, 1)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(
        Boot(**BOOT_B).text(changed)).encode())))
    status, out, _ = run_diff(capsysbinary, "-q", a, "-")
    assert (status, out) == (1, f"Traces {a} and - differ\n")


def test_by_marker_from_stdin(tmp_path, capsysbinary, monkeypatch):
    a, b = pair(tmp_path, sections(["one", "two"]), sections(["two"]))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(open(b, "rb").read())))
    status, out, _ = run_diff(capsysbinary, "--by-marker", "-U", "0", a, "-")
    assert status == 1
    (h,) = hunks(out)
    one = accesses(30, seed=sum(map(ord, "one")))
    assert h[1:] == ["-MARK one", *("-" + show(ev) for ev in one)]
    assert out.startswith(f"--- {a}\n+++ -\n")


# --- lost events ----------------------------------------------------------------


def test_lost_events_are_an_error_unless_allowed(tmp_path, capsysbinary):
    events = scenario(20)
    lossy = events[:10] + [("LOST", 5)] + events[10:]
    a, b = pair(tmp_path, events, lossy)
    status, out, err = run_diff(capsysbinary, a, b)
    assert status == 2 and err.count("\n") == 1
    assert err.startswith(f"mmiotrace-ng: {b}: the trace lost 5 events")
    status, out, err = run_diff(capsysbinary, "--allow-lost", "-U", "0", a, b)
    assert status == 1
    assert [x for x in out.splitlines()[2:] if x[:1] in "+-"] == ["+MARK Lost 5 events."]
    assert err == f"mmiotrace-ng: warning: {b} lost 5 events; compared anyway (--allow-lost)\n"
    # both lost as much at the same place: still not trustworthy without --allow-lost
    a, b = pair(tmp_path, lossy, lossy)
    assert run_diff(capsysbinary, a, b)[0] == 2
    assert run_diff(capsysbinary, "--allow-lost", a, b)[0] == 0


def test_lost_events_of_a_recording(tmp_path, capsysbinary):
    recs = Boot().records(scenario(20))
    raw = write_recording(tmp_path / "a.raw", recs, pending=3)
    txt = write(tmp_path / "b.txt", Boot(**BOOT_B).text(scenario(20)))
    status, _, err = run_diff(capsysbinary, raw, txt)
    assert status == 2 and "lost 3 events" in err and err.count("\n") == 1


# --- recordings -----------------------------------------------------------------


def test_recording_equals_its_text(tmp_path, capsysbinary):
    events = scenario(3000) + [("MARK", "half"), *accesses(50, seed=3), ("MAP", BAR2, 0x1000),
                               ("R", BAR2, 1), ("R", BAR2, 1), ("UNMAP", BAR2)]
    recs = Boot(**BOOT_B).records(events)
    header = f"VERSION 20070824\n{PCIDEV}\n"
    raw = write_recording(tmp_path / "t.raw", recs, header)
    for opts in ((False, False, False), (False, True, True)):
        text = write(tmp_path / "t.txt", [header, Renderer(*opts).feed_batch(recs)])
        assert run_diff(capsysbinary, raw, text) == (0, "", "")
        assert run_diff(capsysbinary, text, raw) == (0, "", "")
    other_boot = write(tmp_path / "o.txt", Boot().text(events))
    assert run_diff(capsysbinary, raw, other_boot) == (0, "", "")
    events[1500] = ("R", events[1500][1], 0xABC)
    changed = write(tmp_path / "c.txt", Boot().text(events))
    status, out, _ = run_diff(capsysbinary, "-U", "0", raw, changed)
    assert status == 1
    assert [x for x in out.splitlines()[2:] if x[:1] in "+-"][1:] == ["+" + show(events[1500])]


def test_recording_compat_against_kernel_text(tmp_path, capsysbinary):
    """An access the kernel's decoder leaves UNKNOWN: --compat reads a
    recording the way the kernel tracer printed it."""
    recs = Boot().records([("MAP", BAR, LEN), *accesses(10), ("R", BAR + 4, 9)])
    kernel = Boot(**BOOT_B).text([("MAP", BAR, LEN), *accesses(10), ("UNKNOWN", BAR + 4)])
    cooked = []
    for raw in recs:
        if len(raw) == ctypes.sizeof(NgRecAccess):
            rec = NgRecAccess.from_buffer_copy(raw)
            if rec.value == 9:
                rec.compat_op, rec.compat_value = MMIOTNG_OP_UNKNOWN, 0xF3A500
                raw = bytes(rec)
        cooked.append(raw)
    path = write_recording(tmp_path / "t.raw", cooked)
    k = write(tmp_path / "k.txt", kernel)
    assert run_diff(capsysbinary, "--compat", path, k) == (0, "", "")
    assert run_diff(capsysbinary, path, k)[0] == 1


def test_recording_with_ignored_values(tmp_path, capsysbinary):
    events = [("MAP", BAR, LEN), *accesses(100), ("R", BAR + 0x2800, 1), *accesses(5, seed=4)]
    other = events[:101] + [("R", BAR + 0x2800, 2)] + events[102:]
    raw = write_recording(tmp_path / "t.raw", Boot().records(events))
    txt = write(tmp_path / "t.txt", Boot(**BOOT_B).text(other))
    assert run_diff(capsysbinary, raw, txt)[0] == 1
    assert run_diff(capsysbinary, "--ignore-value", "0x2800", raw, txt) == (0, "", "")


# --- trouble -------------------------------------------------------------------


@pytest.mark.parametrize("content,seen", [
    (b"hello world\n", "it starts 'hello world'"),
    (b"\x1f\x8b\x08\x00binary\x00\xff", "binary data"),
    (b"R four 1.0 1 0x0\n", "it starts 'R four 1.0 1 0x0'")])
def test_not_a_trace(tmp_path, capsysbinary, content, seen):
    bad = tmp_path / "bad"
    bad.write_bytes(content)
    good = write(tmp_path / "g.txt", Boot().text(scenario(5)))
    for argv in ((str(bad), good), (good, str(bad))):
        status, out, err = run_diff(capsysbinary, *argv)
        assert (status, out) == (2, "")
        assert err == (f"mmiotrace-ng: {bad} is not a trace: neither mmiotrace text "
                       f"(20070824) nor a recording of mmiotrace-ng ({seen})\n")


@pytest.mark.parametrize("argv,words", [
    (["/nonexistent/a", "X"], "mmiotrace-ng: cannot read /nonexistent/a"),
    (["-", "-"], "mmiotrace-ng: only one of the traces can be standard input"),
    (["X", "X", "--window", "0"], "not a positive number"),
    (["X", "X", "--ignore-value", "0x28zz"], "not offsets"),
    (["X"], "the following arguments are required: B"),
])
def test_usage_errors(tmp_path, capsysbinary, argv, words):
    good = write(tmp_path / "g.txt", Boot().text(scenario(5)))
    status, out, err = run_diff(capsysbinary, *[good if x == "X" else x for x in argv])
    assert status == 2 and out == ""
    assert words in err.splitlines()[-1]
    if err.startswith("mmiotrace-ng: "):
        assert err.count("\n") == 1
    else:   # argparse's: usage, then the message
        assert err.startswith("usage: mmiotrace-ng diff ")


@pytest.mark.parametrize("section", [b"META\x05\x00\x00\x00{bad}", b"SYMS\x03\x00\x00\x00xyz"])
def test_a_damaged_recording(tmp_path, capsysbinary, section):
    bad = tmp_path / "bad.raw"
    bad.write_bytes(rawfile.MAGIC + section)
    good = write(tmp_path / "g.txt", Boot().text(scenario(5)))
    status, out, err = run_diff(capsysbinary, str(bad), good)
    assert (status, out) == (2, "")
    assert err.startswith(f"mmiotrace-ng: {bad}: its {section[:4].decode()} section is damaged")
    assert err.count("\n") == 1


def test_a_directory_is_unreadable(tmp_path, capsysbinary):
    good = write(tmp_path / "g.txt", Boot().text(scenario(5)))
    status, _, err = run_diff(capsysbinary, str(tmp_path), good)
    assert status == 2 and err.startswith(f"mmiotrace-ng: cannot read {tmp_path}") \
        and err.count("\n") == 1


def test_empty_trace_against_one(tmp_path, capsysbinary):
    """A trace without records (its header only) against one with some;
    an empty file is no trace at all."""
    empty = write(tmp_path / "e.txt", ["VERSION 20070824\n"])
    good = write(tmp_path / "g.txt", Boot().text(scenario(2)))
    status, out, _ = run_diff(capsysbinary, empty, good)
    assert status == 1 and hunks(out)[0][0] == "@@ -1 +1,6 @@ MAP 0xfeb40000 0x20000"
    assert run_diff(capsysbinary, empty, empty) == (0, "", "")
    nothing = write(tmp_path / "n.txt", [])
    assert run_diff(capsysbinary, nothing, good) == (
        2, "", f"mmiotrace-ng: {nothing} is empty: no trace in it\n")


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["diff", "--help"])
    text = capsys.readouterr().out
    assert exc.value.code == 0
    for words in ("--window", "--exact-counts", "--ignore-value", "--by-marker",
                  "folded records", "mmiotrace-ng diff boot1.txt boot2.txt"):
        assert words in " ".join(text.split()) or words in text


# --- size ------------------------------------------------------------------------


def test_large_traces(tmp_path, capsysbinary):
    """200k records a side: equal, then one change in the middle is one hunk."""
    a = write(tmp_path / "a.txt", list(synthetic_lines(200_000, boot=0)))
    lines = list(synthetic_lines(200_000, boot=1))
    assert run_diff(capsysbinary, a, write(tmp_path / "b.txt", lines)) == (0, "", "")
    k = next(i for i in range(len(lines) // 2, len(lines))
             if lines[i].startswith("W") and lines[i + 1].startswith("R"))
    fields = lines[k].split(" ")
    fields[5] = "0x5eed"
    lines[k] = " ".join(fields)
    status, out, _ = run_diff(capsysbinary, "-U", "1", a, write(tmp_path / "b.txt", lines))
    assert status == 1
    (h,) = hunks(out)
    assert [x for x in h if x[:1] in "+-"][1] == f"+W 4 {fields[4]} 0x5eed"


def test_bench_diff_runs():
    """tests/bench/diff_bench.py works (and checks what it measured)."""
    from diff_bench import bench_diff

    rates = bench_diff(3000, repeat=1)
    assert set(rates) == {"txt", "raw", "txt --exact-counts", "raw --exact-counts"}
    assert min(rates.values()) > 0


def test_memory_stays_bounded(tmp_path, monkeypatch):
    """Two traces streamed from generators (no file): the records held at a
    time stay a small part of the whole."""
    from mmiotrace_ng.analysis import tracefile

    def chunks(self, **_):
        lines = synthetic_lines(300_000, boot=int(Path(self.path).name))
        while chunk := [line for _, line in zip(range(10_000), lines, strict=False)]:
            yield chunk

    monkeypatch.setattr(tracefile.Trace, "chunks", chunks)
    held = []
    real = diff._Side.load

    def load(self):
        got = real(self)
        held.append(len(self.keys))
        return got

    monkeypatch.setattr(diff._Side, "load", load)
    for name in "01":
        (tmp_path / name).write_text("VERSION 20070824\n")   # what Trace opens and checks
    args = cli.build_parser().parse_args(["diff", str(tmp_path / "0"), str(tmp_path / "1")])
    assert diff.diff(args, io.BytesIO()) == 0
    # about 250k records a side, in blocks of 10k lines
    assert len(held) > 40 and max(held) <= 30_000


def test_interrupts_and_dma_only_when_asked(tmp_path, capsysbinary):
    """--irq/--dma MARK lines are left out unless asked; asked, they are
    compared without the interrupt number and the bus address (both differ
    between boots), and a handler that did not run is a difference."""
    def irq(n: int, phase: str, what: str) -> tuple:
        return ("MARK", f"irq {n} 0000:00:05.0 {phase} {what}")

    def dma(addr: int) -> tuple:
        return ("MARK", f"dma map 0000:00:05.0 0x{addr:x} 4096 to-device")

    a_events = [*scenario(3), dma(0x1f3a000), irq(24, "enter", "edu"),
                irq(24, "exit", "handled"), *scenario(2)]
    same = [*scenario(3), dma(0x2000000), irq(31, "enter", "edu"),
            irq(31, "exit", "handled"), *scenario(2)]
    missing = [*scenario(3), dma(0x2000000), *scenario(2)]
    a, b = pair(tmp_path, a_events, same)
    for flags in ([], ["--irq"], ["--dma"], ["--irq", "--dma"]):
        assert run_diff(capsysbinary, *flags, a, b) == (0, "", ""), flags
    a, b = pair(tmp_path, a_events, missing)
    assert run_diff(capsysbinary, a, b)[0] == 0
    assert run_diff(capsysbinary, "--dma", a, b)[0] == 0
    status, out, _ = run_diff(capsysbinary, "--irq", a, b)
    assert status == 1 and "irq" in out, out
    # and --by-marker does not start sections at them
    assert run_diff(capsysbinary, "--by-marker", a, b)[0] == 0
