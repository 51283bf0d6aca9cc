"""export --chrome: Chrome trace-event JSON of text and recorded traces.

The inputs are built here, so the right events are known: every R/W is one
complete event with its value, every MARK a global instant, every MAP a
b/e pair.  `check_trace_events` is a validator of the Trace Event Format's
rules (the object form, the keys each phase needs, async pairs, metadata),
plus Perfetto's rule that the complete events of a thread nest and never
overlap partially."""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from mmiotrace_ng.analysis import export
from mmiotrace_ng.analysis.accesses import Event
from mmiotrace_ng.analysis.tracefile import Trace
from mmiotrace_ng.common.errors import EXIT_USAGE, UsageError
from mmiotrace_ng.format import rawfile
from mmiotrace_ng.format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_UNKNOWN, MMIOTNG_OP_WRITE
from mmiotrace_ng.format.records import (
    NgRecAccess,
    NgRecDma,
    NgRecIrq,
    NgRecMap,
    NgRecMark,
    NgRecType,
    NgRecUnmap,
    NgRecUntraced,
)

PHASES = {"X", "b", "e", "i", "M"}
METADATA = {"process_name": "name", "thread_name": "name",
            "process_sort_index": "sort_index", "thread_sort_index": "sort_index"}


def check_trace_events(doc: object) -> list[dict]:
    """The events of a JSON object trace after checking it against the
    format's rules (AssertionError says which is broken)."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert doc.get("displayTimeUnit") in ("ms", "ns")
    assert isinstance(doc.get("otherData", {}), dict)
    evs = doc["traceEvents"]
    open_async: dict[tuple, list[dict]] = defaultdict(list)
    spans: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for ev in evs:
        assert isinstance(ev, dict), ev
        ph = ev.get("ph")
        assert ph in PHASES, ev
        assert isinstance(ev.get("name"), str) and ev["name"], ev
        assert isinstance(ev.get("pid"), int) and isinstance(ev.get("tid"), int), ev
        if "args" in ev:
            assert isinstance(ev["args"], dict), ev
        if ph == "M":
            assert ev["name"] in METADATA, ev
            value = ev["args"][METADATA[ev["name"]]]
            assert isinstance(value, str if METADATA[ev["name"]] == "name" else int), ev
            continue
        ts = ev.get("ts")
        assert isinstance(ts, int | float) and not isinstance(ts, bool) and ts >= 0, ev
        if ph == "X":
            assert isinstance(ev.get("dur"), int | float) and ev["dur"] >= 0, ev
            spans[ev["pid"], ev["tid"]].append((ts, ts + ev["dur"]))
        elif ph == "i":
            assert ev.get("s", "t") in ("g", "p", "t"), ev
        else:       # b, e: nestable async
            assert isinstance(ev.get("cat"), str) and ev["cat"], ev
            assert isinstance(ev.get("id"), int | str), ev
            key = (ev["pid"], ev["cat"], ev["id"])
            if ph == "b":
                open_async[key].append(ev)
            else:
                assert open_async[key], f"e without b: {ev}"
                begin = open_async[key].pop()
                assert begin["name"] == ev["name"] and begin["ts"] <= ts, (begin, ev)
    assert not any(open_async.values()), "b without e"
    for track, sl in spans.items():
        sl.sort(key=lambda s: (s[0], -s[1]))
        stack: list[float] = []
        for start, end in sl:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"X events overlap on {track}"
            stack.append(end)
    return evs


# --- inputs ------------------------------------------------------------------

# a device no shipped register map is for, its BAR 0 at 0xfeb40000
PCIDEV = "PCIDEV 0030 1234abcd 16 feb40000 0 0 0 0 0 0 20000 0 0 0 0 0 0 testdrv\n"
REGS = """device 1234:abcd bar 0
0x0008 4 STATUS  device status
0x0100+4*4 4 TAB%d  a table
"""


def text_trace(path: Path, lines: list[str]) -> str:
    path.write_text("VERSION 20070824\n" + PCIDEV + "".join(lines))
    return str(path)


def t(us: int) -> str:
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def synthetic_text(seed: int = 5) -> tuple[list[str], list[tuple[str, int, int, int]]]:
    """Lines of a trace with two overlapping mappings (one never unmapped),
    marks and a Lost marker, and its accesses as (op, ts_us, phys, value)."""
    rng = random.Random(seed)
    lines = [f"MAP {t(1_000_000)} 1 0xfeb40000 0xffffc90000100000 0x20000 0x0 0\n",
             f"MAP {t(1_000_500)} 2 0xfea00000 0xffffc90000200000 0x1000 0x0 0\n"]
    acc = []
    us = 1_001_000
    for i in range(300):
        us += rng.choice((0, 0, 1, 7, 250))
        op = "RW"[rng.getrandbits(1)]
        map_id, base = (1, 0xFEB40000) if i % 3 else (2, 0xFEA00000)
        phys = base + 4 * rng.randrange(16)
        value = rng.getrandbits(32)
        lines.append(f"{op} 4 {t(us)} {map_id} 0x{phys:x} 0x{value:x} 0x0 0\n")
        acc.append((op, us, phys, value))
        if i == 100:
            lines.append(f"MARK {t(us)} driver up\n")
        if i == 150:
            lines.append("MARK 0.000000 Lost 7 events.\n")
        if i == 200:
            lines.append(f"UNMAP {t(us)} 2 0x0 0\n")
    lines.append(f"MARK {t(us + 5)} the end\n")
    return lines, acc


def load(path: Path) -> list[dict]:
    return check_trace_events(json.loads(path.read_text()))


def run_export(argv: list[str]) -> int:
    """The subcommand as cli.main runs it (UsageError: exit status 2)."""
    ap = argparse.ArgumentParser(prog="mmiotrace-ng export")
    export.setup(ap)
    try:
        return export.run(ap.parse_args(argv))
    except UsageError as exc:
        print(f"mmiotrace-ng: {exc}", file=sys.stderr)
        return EXIT_USAGE


def xs(evs: list[dict]) -> list[dict]:
    return [e for e in evs if e["ph"] == "X"]


# --- text traces -------------------------------------------------------------

def test_text_trace_events(tmp_path):
    lines, acc = synthetic_text()
    src = text_trace(tmp_path / "t.txt", lines)
    assert run_export(["--chrome", str(tmp_path / "t.json"), src]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    evs = check_trace_events(doc)
    got = [(e["name"][0], round(e["ts"]), int(e["args"]["phys"], 16),
            int(e["args"]["value"], 16)) for e in xs(evs)]
    assert sorted(got) == sorted(acc)           # each access once, with its value
    for e in xs(evs):
        phys = int(e["args"]["phys"], 16)
        base = 0xFEB40000 if phys >= 0xFEB40000 else 0xFEA00000
        assert e["name"] == f"{e['name'][0]} 4 +0x{phys - base:04x}"
        assert e["tid"] == 0 and e["args"]["width"] == 4
    marks = [e for e in evs if e["ph"] == "i"]
    assert all(e["s"] == "g" for e in marks)
    assert [m["name"] for m in marks] == ["driver up", "Lost 7 events.", "the end"]
    # the Lost marker is where the events went missing, not at time 0
    assert marks[1]["ts"] == acc[151][1]
    spans = {e["id"]: e for e in evs if e["ph"] == "e"}
    assert sorted(e["id"] for e in evs if e["ph"] == "b") == sorted(spans) == [1, 2]
    assert spans[2]["ts"] == acc[200][1]            # its UNMAP
    assert spans[1]["ts"] == acc[-1][1] + 5         # never unmapped: the last time
    names = [e for e in evs if e["ph"] == "M" and e["name"] == "thread_name"]
    assert [(e["tid"], e["args"]["name"]) for e in names] == [(0, "MMIO")]
    other = doc["otherData"]
    assert (other["reads"], other["writes"], other["maps"], other["unmaps"],
            other["marks"]) == (str(sum(a[0] == "R" for a in acc)),
                                str(sum(a[0] == "W" for a in acc)), "2", "1", "3")
    assert other["pcidev"] == PCIDEV.rstrip("\n")


def test_each_process_s_mappings_and_accesses_are_on_its_own_track(tmp_path):
    """A kernel driver's mapping and two processes' mappings of the same BAR
    (MAPs at user addresses with their pids): each process's accesses
    and mapping span on that process's track, the driver's on
    mmiotrace-ng's, the kernel driver's accesses there even with a pid."""
    lines = [
        f"MAP {t(1_000_000)} 1 0xfeb40000 0xffffc90000100000 0x1000 0x0 77\n",
        f"MAP {t(1_000_010)} 2 0xfeb40000 0x7f0000001000 0x1000 0x0 4242\n",
        f"R 4 {t(1_000_020)} 2 0xfeb40008 0x1 0x401000 4242\n",
        f"R 4 {t(1_000_030)} 1 0xfeb40008 0x2 0x0 77\n",
        f"MAP {t(1_000_040)} 3 0xfeb40000 0x7f0000002000 0x1000 0x0 4343\n",
        f"W 4 {t(1_000_050)} 3 0xfeb40004 0x3 0x401010 4343\n",
        f"W 4 {t(1_000_060)} 2 0xfeb40004 0x4 0x401020 4242\n",
        f"UNMAP {t(1_000_070)} 2 0x0 4242\n",
    ]
    src = text_trace(tmp_path / "t.txt", lines)
    assert run_export(["--chrome", str(tmp_path / "t.json"), src]) == 0
    evs = load(tmp_path / "t.json")
    by_value = {int(e["args"]["value"], 16): e["pid"] for e in xs(evs)}
    assert by_value == {1: 4242, 2: export.PID, 3: 4343, 4: 4242}
    spans = {e["id"]: e["pid"] for e in evs if e["ph"] == "b"}
    assert spans == {1: export.PID, 2: 4242, 3: 4343}
    assert {e["id"]: e["pid"] for e in evs if e["ph"] == "e"} == spans
    procs = {e["pid"]: e["args"]["name"] for e in evs
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {export.PID: "mmiotrace-ng", 4242: "process 4242", 4343: "process 4343"}
    threads = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {(export.PID, 0), (4242, 0), (4343, 0)}


def test_register_names_from_a_namer(tmp_path):
    lines, acc = synthetic_text()
    src = text_trace(tmp_path / "t.txt", lines)
    names = {0xFEB40008: "STATUS", 0xFEA00004: "ID"}
    out = io.StringIO()
    export.write_chrome(Trace(src), out, names.get)
    evs = check_trace_events(json.loads(out.getvalue()))
    for e in xs(evs):
        phys = int(e["args"]["phys"], 16)
        if phys in names:
            assert e["name"] == f"{e['name'][0]} {names[phys]}"
            assert e["args"]["register"] == names[phys]
        else:
            assert e["name"].startswith(f"{e['name'][0]} 4 +0x") and "register" not in e["args"]
    assert {e["name"] for e in xs(evs)} >= {"R STATUS", "W STATUS"}


def test_register_names_from_a_map(tmp_path, capsys):
    """--regs FILE: names where the map's device (by the PCIDEV line) has them."""
    lines = ["MAP 1.000000 1 0xfeb40000 0xffffc90000100000 0x20000 0x0 0\n",
             "MAP 1.000000 2 0xfea00000 0xffffc90000200000 0x1000 0x0 0\n"]
    want = {0xFEB40008: "STATUS", 0xFEB40100: "TAB0", 0xFEB4010C: "TAB3",
            0xFEB40004: None, 0xFEA00008: None}        # no register; not that device's BAR
    for i, phys in enumerate(want):
        lines.append(f"W 4 1.{i + 1:06d} {1 + (phys < 0xFEB40000)} 0x{phys:x} 0x{i:x} 0x0 0\n")
    src = text_trace(tmp_path / "t.txt", lines)
    (tmp_path / "t.regs").write_text(REGS)
    out = tmp_path / "t.json"
    assert run_export(["--chrome", str(out), "--regs", str(tmp_path / "t.regs"), src]) == 0
    got = {int(e["args"]["phys"], 16): e for e in xs(load(out))}
    for phys, name in want.items():
        assert got[phys]["args"].get("register") == name
        assert got[phys]["name"] == (f"W {name}" if name else f"W 4 +0x{phys & 0xfff:04x}")
    assert capsys.readouterr().err == ""


def test_register_map_errors(tmp_path, capsys):
    src = text_trace(tmp_path / "t.txt", [])
    out = tmp_path / "t.json"
    assert run_export(["--chrome", str(out), "--regs", "no-such-map", src]) == 2
    assert "no register map 'no-such-map'" in capsys.readouterr().err and not out.exists()
    (tmp_path / "other.regs").write_text(REGS.replace("1234:abcd", "1234:0001"))
    assert run_export(["--chrome", str(out), "--regs", str(tmp_path / "other.regs"), src]) == 0
    assert "other.regs not applied: no device 1234:0001" in capsys.readouterr().err


def test_unreadable_input_and_output(tmp_path, capsys):
    assert run_export(["--chrome", str(tmp_path / "o.json"), str(tmp_path / "none")]) == 2
    assert "cannot read" in capsys.readouterr().err
    src = text_trace(tmp_path / "t.txt", [])
    assert run_export(["--chrome", str(tmp_path / "no" / "o.json"), src]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_standard_output(tmp_path, capsysbinary):
    lines, acc = synthetic_text()
    assert run_export(["--chrome", "-", text_trace(tmp_path / "t.txt", lines)]) == 0
    evs = check_trace_events(json.loads(capsysbinary.readouterr().out))
    assert len(xs(evs)) == len(acc)


def test_marks_are_valid_utf8(tmp_path):
    """MARK text as written, a byte that is not UTF-8 as U+FFFD: JSON is UTF-8."""
    src = tmp_path / "t.txt"
    src.write_bytes(b"VERSION 20070824\nMARK 1.000000 caf\xc3\xa9 \"q\" \xff\\\n")
    out = tmp_path / "t.json"
    assert run_export(["--chrome", str(out), str(src)]) == 0
    (mark,) = [e for e in check_trace_events(json.loads(out.read_bytes().decode("utf-8")))
               if e["ph"] == "i"]
    assert mark["name"] == 'caf\u00e9 "q" \ufffd\\'


# --- the order of events in time --------------------------------------------

def test_accesses_on_one_thread_never_overlap():
    """Accesses close together, at one time and out of time order (as
    records of one CPU can be): the validator's nesting rule holds."""
    out = io.StringIO()
    w = export.ChromeWriter(out)
    w.begin({})
    rng = random.Random(3)
    ns = 10_000_000
    want = []
    for i in range(2000):
        ns += rng.choice((0, 100, 400, 999, 1000, 5000, -700, -3000))
        want.append(ns)
        w.feed(Event("R", ns, i % 2, 1, 0x1000, 4, i))
    w.end()
    evs = check_trace_events(json.loads(out.getvalue()))
    assert sorted(round(e["ts"] * 1000) for e in xs(evs)) == sorted(want)
    assert max(e["dur"] for e in xs(evs)) == export.ACCESS_NS / 1000


def test_events_are_written_in_time_order(monkeypatch):
    """Records of two CPUs interleaved out of time order, a MARK and a MAP
    among them: the metadata first, then every event by its time, also
    when the events are more than the sorter holds in memory."""
    from mmiotrace_ng.format import timeorder

    monkeypatch.setattr(timeorder, "RUN", 100)      # spills to files past 100
    out = io.StringIO()
    w = export.ChromeWriter(out)
    w.begin({})
    rng = random.Random(5)
    for i in range(1000):
        cpu = i % 2
        w.feed(Event("W", 10**7 + 10**6 * i + (0 if cpu else rng.randrange(-3 * 10**6, 0)), cpu,
                     1, 0x1000, 4, i))
        if i == 500:
            w.feed(Event("MARK", 10**7 + 10**6 * i - 2_500_000, 1, text="half way"))
            w.feed(Event("MAP", 10**7 + 10**6 * i - 1_500_000, 0, 2, 0x2000, value=0x1,
                         length=0x1000))
    w.end()
    assert len(w.order.spilled) == 0        # merged and closed
    evs = check_trace_events(json.loads(out.getvalue()))
    phases = [e["ph"] for e in evs]
    assert phases.index("X") > max(i for i, ph in enumerate(phases) if ph == "M")
    times = [e["ts"] for e in evs if e["ph"] != "M"]
    assert times == sorted(times) and len(xs(evs)) == 1000


def test_time_order_spills_and_merges():
    from mmiotrace_ng.format.timeorder import TimeOrder

    order = TimeOrder(run=7)
    rng = random.Random(1)
    want = [(rng.randrange(50), f"t{i} \u00e9") for i in range(100)]
    for ts, text in want:
        order.add(ts, text)
    assert len(order.spilled) == 14
    assert list(order.items()) == sorted(want, key=lambda p: p[0])    # stable


# --- recorded files -----------------------------------------------------------

KALLSYMS = ("ffffffff81000000 T _stext\n"
            "ffffffffc0500000 t e1000_probe\t[e1000]\n"
            "ffffffffc0500400 t e1000_reset\t[e1000]\n"
            "ffffffffc0500800 t e1000_end\t[e1000]\n"
            "ffffffffc0500c00 d e1000_data\t[e1000]\n")


def access(ts, cpu, op, phys, value, ip=0, map_id=1, lost=0) -> bytes:
    r = NgRecAccess(phys=phys, value=value, compat_value=value, ip=ip, map_id=map_id,
                    pid=100 + cpu, width=4, op=op, compat_width=4, compat_op=op)
    r.hdr.ts_ns, r.hdr.cpu, r.hdr.type, r.hdr.lost = ts, cpu, NgRecType.NG_REC_ACCESS, lost
    r.insn[0], r.insn[1], r.insn[2] = 0xF3, 0xA5, 0x90
    return bytes(r)


def mapping(ts, cpu, map_id, phys, length) -> bytes:
    r = NgRecMap(phys=phys, virt=0xFFFFC90000000000 + phys, len=length, map_id=map_id)
    r.hdr.ts_ns, r.hdr.cpu, r.hdr.type = ts, cpu, NgRecType.NG_REC_MAP
    return bytes(r)


def unmapping(ts, cpu, map_id) -> bytes:
    r = NgRecUnmap(virt=0, map_id=map_id)
    r.hdr.ts_ns, r.hdr.cpu, r.hdr.type = ts, cpu, NgRecType.NG_REC_UNMAP
    return bytes(r)


def mark(ts, cpu, text: bytes) -> bytes:
    r = NgRecMark(len=len(text))
    r.hdr.ts_ns, r.hdr.cpu, r.hdr.type = ts, cpu, NgRecType.NG_REC_MARK
    ctypes.memmove(ctypes.addressof(r) + NgRecMark.text.offset, text, len(text))
    return bytes(r)[: NgRecMark.text.offset + len(text)]


def untraced(ts, cpu) -> bytes:
    r = NgRecUntraced(phys=0xFE000000, virt=0xFFFFC90000300000, len=0x1000, err=-2)
    r.hdr.ts_ns, r.hdr.cpu, r.hdr.type = ts, cpu, NgRecType.NG_REC_UNTRACED
    return bytes(r)


def test_recorded_file_one_thread_per_cpu(tmp_path):
    rng = random.Random(7)
    recs = [mapping(1_000_000_000, 0, 1, 0xFEB40000, 0x20000),
            mapping(1_000_000_500, 2, 2, 0xFEA00000, 0x1000)]
    want = []
    ns = 1_000_001_000
    for i in range(400):
        ns += rng.randrange(0, 3000)
        cpu = rng.randrange(4)
        op = rng.choice((MMIOTNG_OP_READ, MMIOTNG_OP_WRITE, MMIOTNG_OP_UNKNOWN))
        phys = 0xFEB40000 + 4 * rng.randrange(64)
        value = rng.getrandbits(64)
        ip = 0xFFFFFFFFC0500000 + rng.randrange(0xC00) if i % 2 else 0
        lost = 3 if i == 50 else 0
        recs.append(access(ns, cpu, op, phys, value, ip, lost=lost))
        want.append((ns, cpu, op, phys, value, ip))
        if i == 100:
            recs.append(mark(ns, cpu, b"half way\n"))
        if i == 200:
            recs.append(unmapping(ns, 1, 2))
        if i == 300:
            recs.append(untraced(ns, 3))
    path = tmp_path / "t.rec"
    w = rawfile.RawWriter(str(path))
    w.meta({"kernel": "6.1.0-test"})
    w.header("VERSION 20070824\n")
    w.records(recs[:200])
    w.records(recs[200:] + [b"\x01\x02"])   # a corrupt record is skipped
    w.end(3 + 9, 9, KALLSYMS, None)
    w.close()
    out = tmp_path / "t.json"
    assert run_export(["--chrome", str(out), str(path)]) == 0
    doc = json.loads(out.read_text())
    evs = check_trace_events(doc)
    got = sorted((round(e["ts"] * 1000), e["tid"], e["name"].split()[0], int(e["args"]["phys"], 16),
                  e["args"].get("value"), e["args"].get("caller")) for e in xs(evs))
    ops = {MMIOTNG_OP_READ: "R", MMIOTNG_OP_WRITE: "W", MMIOTNG_OP_UNKNOWN: "UNKNOWN"}

    def caller(ip: int) -> str | None:
        if not ip:
            return None
        fn, base = [("e1000_probe", 0xFFFFFFFFC0500000), ("e1000_reset", 0xFFFFFFFFC0500400),
                    ("e1000_end", 0xFFFFFFFFC0500800)][(ip - 0xFFFFFFFFC0500000) // 0x400]
        return f"{fn}+0x{ip - base:x}/0x400 [e1000]"

    assert got == sorted((ns, cpu, ops[op], phys, None if op == MMIOTNG_OP_UNKNOWN
                          else f"0x{value:x}", caller(ip))
                         for ns, cpu, op, phys, value, ip in want)
    unknown = [e for e in xs(evs) if e["name"].startswith("UNKNOWN")]
    assert unknown and all(e["args"]["insn"] == "f3,a5,90" for e in unknown)
    names = {e["tid"]: e["args"]["name"] for e in evs
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {c: f"CPU {c}" for c in range(4)}
    marks = {e["name"]: e for e in evs if e["ph"] == "i"}
    assert all(e["s"] == "g" for e in marks.values())
    assert set(marks) == {"Lost 3 events.", "half way", "Lost 9 events.",
                          "mmiotrace-ng: ioremap of 0xfe000000 size 0x1000 at "
                          "0xffffc90000300000 is NOT traced: it is not inside one traced BAR"}
    assert round(marks["Lost 3 events."]["ts"] * 1000) == want[50][0]
    assert round(marks["Lost 9 events."]["ts"] * 1000) == want[-1][0]
    b = Counter(e["id"] for e in evs if e["ph"] == "b")
    e_ = {e["id"]: round(e["ts"] * 1000) for e in evs if e["ph"] == "e"}
    assert b == Counter({1: 1, 2: 1}) and e_ == {1: want[-1][0], 2: want[200][0]}
    assert doc["otherData"]["meta.kernel"] == "6.1.0-test"
    assert doc["otherData"]["format"] == "mmiotrace-ng recording"


def test_format_1_recording(tmp_path):
    """--raw files of earlier versions: the records as they are."""
    path = tmp_path / "old.raw"
    payloads = [access(5_000_000_000 + 10 * i, i % 3, i % 2, 0xFEA00000 + 4 * i, i)
                for i in range(20)]
    with open(path, "wb") as fh:
        fh.write(rawfile.RAW1_MAGIC)
        for frame in [b"VERSION 20070824\n", *payloads]:
            fh.write(len(frame).to_bytes(4, "little") + frame)
    out = io.StringIO()
    export.write_chrome(Trace(str(path)), out)
    evs = xs(check_trace_events(json.loads(out.getvalue())))
    assert [(e["tid"], int(e["args"]["value"], 16)) for e in evs] == [
        (i % 3, i) for i in range(20)]


def test_export_of_the_cli(tmp_path, capsys):
    """The subcommand as the command line has it."""
    from mmiotrace_ng import cli

    lines, acc = synthetic_text()
    out = tmp_path / "t.json"
    assert cli.main(["export", "--chrome", str(out), text_trace(tmp_path / "t.txt", lines)]) == 0
    assert len(xs(load(out))) == len(acc)
    with pytest.raises(SystemExit) as exc:
        cli.main(["export", str(tmp_path / "t.txt")])
    assert exc.value.code == 2 and "--chrome" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [
    {"traceEvents": [{"name": "a", "ph": "X", "ts": 1, "pid": 1, "tid": 1}]},   # no dur
    {"traceEvents": [{"name": "a", "ph": "i", "s": "x", "ts": 1, "pid": 1, "tid": 1}]},
    {"traceEvents": [{"name": "a", "ph": "b", "cat": "c", "id": 1, "ts": 1, "pid": 1,
                      "tid": 1}]},                                                # no e
    {"traceEvents": [{"name": "a", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1},
                     {"name": "b", "ph": "X", "ts": 2, "dur": 2, "pid": 1, "tid": 1}]},
    {"traceEvents": [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {}}]},
    {"traceEvents": [{"name": "a", "ph": "X", "ts": "1", "dur": 0, "pid": 1, "tid": 1}]},
])
def test_the_validator_rejects(bad):
    bad["displayTimeUnit"] = "ns"
    with pytest.raises((AssertionError, KeyError)):
        check_trace_events(bad)


def irq_rec(ts, cpu, irq, exit_, ret=0) -> bytes:
    r = NgRecIrq(irq=irq, exit=exit_, ret=ret, dev=b"0000:00:05.0", handler=b"edu")
    r.hdr.ts_ns, r.hdr.cpu, r.hdr.type = ts, cpu, NgRecType.NG_REC_IRQ
    return bytes(r)


def dma_rec(ts, cpu, kind, addr, size, way) -> bytes:
    r = NgRecDma(addr=addr, size=size, kind=kind, dir=way, dev=b"0000:00:05.0")
    r.hdr.ts_ns, r.hdr.cpu, r.hdr.type = ts, cpu, NgRecType.NG_REC_DMA
    return bytes(r)


def test_interrupts_and_dma_have_tracks_of_their_own(tmp_path):
    """A recording's interrupts: a span per handler run, from its entry to
    its exit, on the interrupt's own track; its DMA mappings: a span from
    map (alloc) to unmap (free) of the same bus address, one still mapped
    at the end ended there; the accesses' tracks as before."""
    recs = [mapping(1_000_000_000, 0, 1, 0xFEA00000, 0x1000),
            dma_rec(1_000_001_000, 0, 2, 0x100000, 4096, 0),       # alloc
            dma_rec(1_000_002_000, 0, 0, 0x200000, 4096, 1),       # map
            access(1_000_003_000, 0, MMIOTNG_OP_WRITE, 0xFEA00060, 1),
            irq_rec(1_000_004_000, 1, 24, 0),
            access(1_000_005_000, 1, MMIOTNG_OP_READ, 0xFEA00024, 1),
            irq_rec(1_000_007_000, 1, 24, 1, ret=1),
            dma_rec(1_000_008_000, 0, 1, 0x200000, 4096, 1),       # unmap
            irq_rec(1_000_009_000, 0, 25, 1, ret=0)]               # exit without entry
    path = tmp_path / "t.rec"
    w = rawfile.RawWriter(str(path))
    w.meta({"kernel": "6.12-test"})
    w.header("VERSION 20070824\n")
    w.records(recs)
    w.end(0, 0, KALLSYMS, None)
    w.close()
    out = tmp_path / "t.json"
    assert run_export(["--chrome", str(out), str(path)]) == 0
    doc = json.loads(out.read_text())
    evs = check_trace_events(doc)
    names = {e["tid"]: e["args"]["name"] for e in evs
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[export.IRQ_TID + 24] == "irq 24 0000:00:05.0"
    assert names[export.DMA_TID] == "DMA"
    runs = [e for e in evs if e.get("cat") == "irq" and e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"], e["args"]["result"]) for e in runs] == [
        ("irq 24 edu", 1_000_004, 3, "handled")]
    assert [e["name"] for e in evs if e.get("cat") == "irq" and e["ph"] == "i"] == [
        "irq 25 exit none"]
    spans = [(e["ph"], e["name"], e["ts"]) for e in evs if e.get("cat") == "dma"]
    assert spans == [("b", "DMA 0x100000 +4096 bidirectional", 1_000_001),
                     ("b", "DMA 0x200000 +4096 to-device", 1_000_002),
                     ("e", "DMA 0x200000 +4096 to-device", 1_000_008),
                     ("e", "DMA 0x100000 +4096 bidirectional", 1_000_009)]
    assert [e["name"] for e in xs(evs) if e["cat"] == "mmio"] == ["W 4 +0x0060", "R 4 +0x0024"]
    assert doc["otherData"]["interrupt_records"] == "3"
    assert doc["otherData"]["dma_records"] == "3"
