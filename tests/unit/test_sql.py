"""export --parquet and query: the tables of traces built here, whose right
rows are known by construction (the list each trace is made from), and the
named queries' answers worked out from the same lists; the missing extras'
message; DuckDB over a directory of exports from several machines."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from ng_require import optional
from test_cli import run_main
from test_export import KALLSYMS, access, mapping, mark, unmapping

from mmiotrace_ng.analysis import extras
from mmiotrace_ng.format import rawfile
from mmiotrace_ng.format.abi import MMIOTNG_OP_READ, MMIOTNG_OP_UNKNOWN, MMIOTNG_OP_WRITE

BAR0 = 0xFEA00000
# QEMU's edu at 00:05.0 (the shipped edu.regs applies), BAR 0 of 1 MiB
PCIDEV = "PCIDEV 0028 123411e8 b fea00000 0 0 0 0 0 0 100000 0 0 0 0 0 0 edu\n"
# (DMA_SRC is 8 bytes wide: 0x84 is its upper half)
EDU = {0x00: "ID", 0x04: "LIVENESS", 0x20: "STATUS", 0x24: "IRQ_STATUS", 0x80: "DMA_SRC",
       0x84: "DMA_SRC+4"}
POLL = 7


def pyarrow():
    return optional("pyarrow.parquet", "python3-pyarrow",
                    "pyarrow is not installed (python3-pyarrow, or pip install "
                    "'mmiotrace-ng[sql]')")


def duckdb():
    pyarrow()
    return optional("duckdb", None, "duckdb is not installed (pip install 'mmiotrace-ng[sql]')")


def script() -> list[tuple]:
    """The trace as records: ("MAP",), ("R"|"W", offset, value, cpu, pc),
    ("MARK", text), ("LOST", n), ("UNKNOWN", offset, cpu), ("UNMAP",); a poll
    of POLL reads of ID on CPU 1, sections init, run and end."""
    s: list[tuple] = [("MAP",), ("R", 0x00, 0x010000ED, 0, 0xFFFFFFFFC0500010)]
    s += [("R", 0x20, 0x1, 1, 0xFFFFFFFFC0500420)] * POLL          # a poll of STATUS
    s += [("R", 0x20, 0x0, 1, 0xFFFFFFFFC0500420), ("MARK", "init")]
    s += [("W", 0x04, v, v % 2, 0xFFFFFFFFC0500030) for v in range(10)]
    s += [("R", 0x04, 0xFFFFFFF6, 0, 0xFFFFFFFFC0500040), ("MARK", "run"), ("LOST", 3),
          ("W", 0x80, 0x1234, 0, 0xFFFFFFFFC0500440), ("UNKNOWN", 0x84, 1),
          ("R", 0x40, 0xFFFFFFFF, 0, 0xFFFFFFFFC0500050), ("W", 0x04, 0xAA, 1, 0),
          ("UNMAP",), ("MARK", "end")]
    return s


def t(ns: int) -> str:
    us = ns // 1000
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def times() -> list[int]:
    return [5_000_000_000 + 1000 * i for i in range(len(script()))]


def text_trace(path: Path) -> Path:
    """The script as the kernel's tracer prints it (pc 0, pid 0)."""
    lines = ["VERSION 20070824\n", PCIDEV]
    for ns, r in zip(times(), script(), strict=True):
        if r[0] == "MAP":
            lines.append(f"MAP {t(ns)} 1 0x{BAR0:x} 0xffffc90000100000 0x100000 0x0 0\n")
        elif r[0] in ("R", "W"):
            lines.append(f"{r[0]} 4 {t(ns)} 1 0x{BAR0 + r[1]:x} 0x{r[2]:x} 0x0 0\n")
        elif r[0] == "MARK":
            lines.append(f"MARK {t(ns)} {r[1]}\n")
        elif r[0] == "LOST":
            lines.append(f"MARK 0.000000 Lost {r[1]} events.\n")
        elif r[0] == "UNKNOWN":
            lines.append(f"UNKNOWN {t(ns)} 1 0x{BAR0 + r[1]:x} f3,a5,90 0x0 0\n")
        else:
            lines.append(f"UNMAP {t(ns)} 1 0x0 0\n")
    path.write_text("".join(lines))
    return path


def recording(path: Path) -> Path:
    """The script recorded: each record on its CPU, with its pc."""
    recs: list[bytes] = []
    lost = 0
    for ns, r in zip(times(), script(), strict=True):
        if r[0] == "MAP":
            recs.append(mapping(ns, 0, 1, BAR0, 0x100000))
        elif r[0] in ("R", "W"):
            op = MMIOTNG_OP_READ if r[0] == "R" else MMIOTNG_OP_WRITE
            recs.append(access(ns, r[3], op, BAR0 + r[1], r[2], r[4], lost=lost))
            lost = 0
        elif r[0] == "MARK":
            recs.append(mark(ns, 0, r[1].encode() + b"\n"))
        elif r[0] == "LOST":
            lost = r[1]         # said by the next record
        elif r[0] == "UNKNOWN":
            recs.append(access(ns, r[2], MMIOTNG_OP_UNKNOWN, BAR0 + r[1], 0))
        else:
            recs.append(unmapping(ns, 0, 1))
    w = rawfile.RawWriter(str(path))
    w.meta({"kernel": "6.1.0-test", "host": "testbox"})
    w.header("VERSION 20070824\n" + PCIDEV)
    w.records(recs[:9])
    w.records(recs[9:])
    w.end(3, 0, KALLSYMS, None)
    w.close()
    return path


def expected_rows() -> list[dict]:
    """The records table's rows the script makes (the columns both a text
    trace and a recording have)."""
    rows = []
    section = None
    for seq, (_ns, r) in enumerate(zip(times(), script(), strict=True)):
        row = {"seq": seq, "kind": r[0], "width": None, "phys": None, "value": None,
               "bdf": None, "bar": None, "bar_offset": None, "register": None, "text": None,
               "lost": None, "insn": None}
        if r[0] in ("R", "W", "UNKNOWN", "MAP", "UNMAP"):
            off = r[1] if r[0] in ("R", "W", "UNKNOWN") else 0
            row.update(phys=BAR0 + off, bdf="00:05.0", bar=0, bar_offset=off)
        if r[0] in ("R", "W"):
            row.update(width=4, value=r[2], register=EDU.get(r[1]))
        if r[0] == "UNKNOWN":
            row.update(insn="f3,a5,90", register=EDU.get(r[1]))
        if r[0] == "MARK":
            section = r[1]
            row["text"] = r[1]
        if r[0] == "LOST":
            row.update(text=f"Lost {r[1]} events.", lost=r[1])
        row["section"] = section
        rows.append(row)
    return rows


def export(src: Path, out: Path, capsys) -> dict[str, list[dict]]:
    pq = pyarrow()
    assert run_main(["export", "--parquet", str(out), str(src)], capsys) == (0, "", "")
    return {t: pq.read_table(out / f"{t}.parquet").to_pylist()
            for t in ("records", "devices", "mappings")}


def pick(rows: list[dict], keys) -> list[dict]:
    return [{k: r[k] for k in keys} for r in rows]


@pytest.mark.parametrize("kind", ["text", "recording"])
def test_records_table_is_the_script(kind, tmp_path, capsys):
    src = (text_trace if kind == "text" else recording)(tmp_path / "in")
    tables = export(src, tmp_path / "out", capsys)
    want = expected_rows()
    got = tables["records"]
    assert pick(got, want[0]) == want
    # times to the microsecond in text, to the nanosecond recorded
    assert [r["ts_ns"] for r in got if r["kind"] != "LOST"] == \
        [ns for ns, r in zip(times(), script(), strict=True) if r[0] != "LOST"]
    accesses = [r for r in script() if r[0] in ("R", "W")]
    rw = [r for r in got if r["kind"] in ("R", "W")]
    if kind == "text":
        assert {r["cpu"] for r in got} == {None} and {r["pc"] for r in got} == {None}
    else:
        assert [(r["cpu"], r["pc"] or 0) for r in rw] == [(a[3], a[4]) for a in accesses]
        fns = {0xFFFFFFFFC0500000: "e1000_probe", 0xFFFFFFFFC0500400: "e1000_reset"}
        assert [(r["symbol"], r["symbol_offset"], r["module"]) for r in rw] == [
            (fns[a[4] & ~0x3FF], a[4] & 0x3FF, "e1000") if a[4] else (None, None, None)
            for a in accesses]
    # the register map's fields, where it has them: ID's
    ident = [r["fields"] for r in got if r["register"] == "ID"]
    assert ident == ["{MAJOR=1 MAGIC=0xed}"]
    assert tables["devices"] == [{
        "bdf": "00:05.0", "vendor": 0x1234, "device": 0x11E8, "ids": "1234:11e8",
        "driver": "edu", "bar": 0, "space": "mem", "start": BAR0, "size": 0x100000,
        "line": PCIDEV.rstrip("\n")}]
    (m,) = tables["mappings"]
    unmap = next(i for i, r in enumerate(script()) if r[0] == "UNMAP")
    assert pick([m], ["map_id", "phys", "length", "bdf", "bar", "bar_offset", "map_seq",
                      "unmap_seq", "map_ns", "unmap_ns"]) == [{
        "map_id": 1, "phys": BAR0, "length": 0x100000, "bdf": "00:05.0", "bar": 0,
        "bar_offset": 0, "map_seq": 0, "unmap_seq": unmap, "map_ns": times()[0],
        "unmap_ns": times()[unmap]}]


def test_text_and_recording_give_equal_tables(tmp_path, capsys):
    """The same records as the kernel's text and as a recording: equal
    tables once time, virtual addresses, map ids and what the kernel's text
    does not have (CPU, pc, pid, symbols) are dropped."""
    a = export(text_trace(tmp_path / "a.txt"), tmp_path / "a", capsys)["records"]
    b = export(recording(tmp_path / "b.rec"), tmp_path / "b", capsys)["records"]
    drop = {"ts_ns", "virt", "map_id", "cpu", "pc", "pid", "symbol", "symbol_offset", "module"}
    keys = [k for k in a[0] if k not in drop]
    assert pick(a, keys) == pick(b, keys)


def test_batches_split_anywhere_give_the_same_table(tmp_path, capsys, monkeypatch):
    """Row groups of 3 rows (batches cut inside runs of accesses): the same
    table as one row group, in several row groups."""
    pq = pyarrow()
    from mmiotrace_ng.analysis import table

    rec = recording(tmp_path / "in.rec")
    whole = export(rec, tmp_path / "whole", capsys)["records"]
    monkeypatch.setattr(table, "ROWS", 3)
    assert export(rec, tmp_path / "small", capsys)["records"] == whole
    meta = pq.ParquetFile(tmp_path / "small" / "records.parquet").metadata
    assert meta.num_row_groups == -(-len(whole) // 3)
    assert meta.metadata[b"mmiotrace_ng.schema"] == str(table.SCHEMA_VERSION).encode()


def query(src: Path, *argv: str, capsys) -> list[dict]:
    duckdb()
    status, out, err = run_main(["query", str(src), *argv, "--json"], capsys)
    assert (status, err) == (0, ""), err
    return json.loads(out)


@pytest.fixture(params=["text", "recording", "export"])
def source(request, tmp_path, capsys) -> Path:
    """The script as a text trace, a recording, and the recording's export."""
    if request.param == "text":
        return text_trace(tmp_path / "in.txt")
    rec = recording(tmp_path / "in.rec")
    if request.param == "recording":
        return rec
    export(rec, tmp_path / "exported", capsys)
    return tmp_path / "exported"


def test_top_registers(source, capsys):
    counts = Counter((r[0], r[1]) for r in script() if r[0] in ("R", "W"))
    last = {(r[0], r[1]): r[2] for r in script() if r[0] in ("R", "W")}
    got = query(source, "--top-registers", capsys=capsys)
    assert {(r["kind"], int(r["offset"], 16)): r["count"] for r in got} == counts
    assert {(r["kind"], int(r["offset"], 16)): int(r["last"], 16) for r in got} == last
    assert [r["count"] for r in got] == sorted(counts.values(), reverse=True)
    assert {r["register"] for r in got} == {EDU.get(off) for _, off in counts}
    assert len(query(source, "--top-registers", "--limit", "2", capsys=capsys)) == 2


def test_polls(source, capsys):
    got = query(source, "--polls", capsys=capsys)
    # the 7 reads of STATUS giving 1; the other repeats: none (the writes
    # are not reads, each has its own value)
    assert [(r["reads"], r["register"], r["value"]) for r in got] == [(POLL, "STATUS", "0x1")]
    assert got[0]["duration_us"] == (POLL - 1) * 1.0
    if source.suffix != ".txt":
        assert got[0]["function"] == "e1000_reset [e1000]" and got[0]["cpu"] == 1


def test_last_values_and_before(source, capsys):
    def last(rows) -> dict[int, int]:
        out = {}
        for r in rows:
            if r[0] in ("R", "W"):
                out[BAR0 + r[1]] = r[2]
        return out

    got = query(source, "--last-values", capsys=capsys)
    assert {int(r["phys"], 16): int(r["value"], 16) for r in got} == last(script())
    cut = script().index(("MARK", "run"))
    got = query(source, "--last-values", "--before", "run", capsys=capsys)
    assert {int(r["phys"], 16): int(r["value"], 16) for r in got} == last(script()[:cut])


def test_between(source, capsys):
    s = script()
    start, end = s.index(("MARK", "init")), s.index(("MARK", "end"))
    got = query(source, "--between", "init", "end", capsys=capsys)
    assert [r["seq"] for r in got] == list(range(start + 1, end))
    assert [r["kind"] for r in got] == [r[0] for r in s[start + 1:end]]
    # SQL sees the same records: the writes between, by register
    got = query(source, "SELECT register, count(*) AS n FROM records WHERE kind = 'W' "
                "GROUP BY register ORDER BY register", "--between", "init", "end",
                capsys=capsys)
    want = Counter(EDU[r[1]] for r in s[start + 1:end] if r[0] == "W")
    assert {r["register"]: r["n"] for r in got} == want


def test_csv_json_and_the_aligned_table_say_the_same(tmp_path, capsys):
    src = text_trace(tmp_path / "in.txt")
    rows = query(src, "--top-registers", capsys=capsys)
    status, out, _ = run_main(["query", str(src), "--top-registers", "--csv"], capsys)
    assert status == 0
    got = list(csv.DictReader(io.StringIO(out)))
    assert got == [{k: "" if v is None else str(v) for k, v in r.items()} for r in rows]
    status, out, _ = run_main(["query", str(src), "--top-registers"], capsys)
    lines = out.splitlines()
    assert status == 0 and lines[0].split() == list(rows[0])
    assert [ln.split() for ln in lines[1:]] == [
        ["-" if v is None else str(v) for v in r.values()] for r in rows]
    # the columns line up: each header word starts where its column does
    # (left-aligned text) or ends where it ends (numbers)
    count_end = lines[0].index("count") + len("count")
    assert all(ln[:count_end].endswith(str(r["count"])) for ln, r in zip(lines[1:], rows,
                                                                        strict=True))


@pytest.mark.parametrize("argv,said", [
    # DuckDB's own words, their first line (the rest differs between versions)
    (["SELEC 1"], "query: Parser Error: syntax error at or near \"SELEC\"..."),
    (["SELECT nothere FROM records"], "query: Binder Error: Referenced column \"nothere\"..."),
    (["--before", "nope"], "no MARK line 'nope' in IN"),
    (["--between", "run", "init"], "no MARK line 'init' after 'run' in IN"),
    (["SELECT 1", "--polls"], "give SQL or a named query (--top-registers, --polls, "
                              "--last-values), not both"),
])
def test_bad_queries_say_one_line(argv, said, tmp_path, capsys):
    duckdb()
    src = text_trace(tmp_path / "in.txt")
    status, out, err = run_main(["query", str(src), *argv], capsys)
    assert (status, out) == (2, "")
    said = f"mmiotrace-ng: {said.replace(' IN', f' {src}')}"
    assert err.count("\n") == 1, err
    if said.endswith("..."):
        assert err.startswith(said.removesuffix("...")), err
    else:
        assert err == said + "\n"


def test_a_damaged_recording_says_one_line(tmp_path, capsys):
    path = recording(tmp_path / "in.rec")
    data = bytearray(path.read_bytes())
    meta = data.index(b"META") + 8
    data[meta:meta + 4] = b"\xff\xfe{{"       # its META is no JSON any more
    path.write_bytes(bytes(data))
    for argv in (["export", "--parquet", str(tmp_path / "out"), str(path)],
                 ["query", str(path), "--polls"]):
        status, out, err = run_main(argv, capsys)
        assert (status, out) == (2, "") and err.count("\n") == 1, err
        assert err.startswith(f"mmiotrace-ng: {path}: its META section is damaged"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,module,needs,said", [
    (["export", "--parquet", "OUT"], "pyarrow", ("pyarrow", "numpy"),
     "export --parquet needs pyarrow: install the distribution's package (Debian sid, "
     "Ubuntu 26.04: apt install python3-pyarrow) or pip install 'mmiotrace-ng[sql]'"),
    (["query"], "duckdb", ("duckdb", "pyarrow", "numpy"),
     "query needs duckdb: pip install 'mmiotrace-ng[sql]' (no Debian package has the "
     "Python module of duckdb)"),
])
def test_without_the_extra_one_line(argv, module, needs, said, tmp_path, capsys,
                                    monkeypatch):
    """What the command says where the module is missing: the module made
    unimportable where it is installed; as it is where it is not (a
    release without its package)."""
    if not extras.absent((module,)):
        monkeypatch.setitem(sys.modules, module, None)      # its import fails
    missing = extras.absent(needs)
    src = text_trace(tmp_path / "in.txt")
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    status, out, err = run_main([*argv, str(src)], capsys)
    assert (status, out) == (2, "")
    if missing == [module]:
        assert err == f"mmiotrace-ng: {said}\n"
    else:       # more than one missing: all are named, on one line
        assert err.count("\n") == 1 and all(m in err for m in missing), err
    assert not (tmp_path / "out").exists()


def machines_store(tmp_path: Path, capsys) -> tuple[Path, dict]:
    """Three machines' exports in a directory partitioned by host and boot
    (host=NAME/boot=ID/), two of them shorter runs; and what they hold: the
    count of each (host, boot, register, R|W), from the scripts."""
    store = tmp_path / "store"
    want: dict[tuple[str, str, str | None, str], int] = {}
    for host, boot, cut in (("a", "1", None), ("a", "2", 12), ("b", "1", 20)):
        src = text_trace(tmp_path / f"{host}{boot}.txt")
        if cut is not None:     # a shorter run
            lines = src.read_text().splitlines(keepends=True)
            src.write_text("".join(lines[:2 + cut]))
        export(src, store / f"host={host}" / f"boot={boot}", capsys)
        part = script() if cut is None else script()[:cut]
        for r in part:
            if r[0] in ("R", "W"):
                key = (host, boot, EDU.get(r[1]), r[0])
                want[key] = want.get(key, 0) + 1
    return store, want


def test_a_directory_of_machines_is_one_table(tmp_path, capsys):
    """Exports of several machines' traces in a directory partitioned by
    host and boot: DuckDB reads them as one table, the partitions as
    columns, and the per-register counts of each machine are its own
    trace's."""
    duck = duckdb()
    store, want = machines_store(tmp_path, capsys)
    con = duck.connect()
    rows = con.execute(
        "SELECT host, boot, register, kind, count(*) FROM read_parquet(?, "
        "hive_partitioning = true) WHERE kind IN ('R', 'W') GROUP BY ALL",
        [str(store / "*" / "*" / "records.parquet")]).fetchall()
    assert {(h, str(b), r, k): n for h, b, r, k, n in rows} == want
    # the devices of every machine, joined
    (n,) = con.execute(
        "SELECT count(*) FROM read_parquet(?, hive_partitioning = true) r JOIN "
        "read_parquet(?, hive_partitioning = true) d USING (host, boot, bdf, bar) "
        "WHERE r.kind = 'W'",
        [str(store / "*" / "*" / "records.parquet"),
         str(store / "*" / "*" / "devices.parquet")]).fetchone()
    assert n == sum(v for (_, _, _, k), v in want.items() if k == "W")


# interrupts and DMA: (ns, cpu, "IRQ", irq, exit, ret, handler) and
# (ns, cpu, "DMA", kind, bus address, size, direction, memory's physical address)
EXTRAS = [
    (7_000_000_000, 0, "DMA", 2, 0x100000, 4096, 0, 0x7F000),          # alloc
    (7_000_001_000, 0, "DMA", 0, 0x200000, 2048, 1, 0x1234000),        # map, to-device
    (7_000_003_000, 1, "IRQ", 24, 0, 0, "edu_exerciser"),
    (7_000_004_000, 1, "IRQ", 24, 1, 1, "edu_exerciser"),              # handled
    (7_000_006_000, 1, "IRQ", 24, 0, 0, "edu_exerciser"),
    (7_000_007_000, 1, "IRQ", 24, 1, 0, "edu_exerciser"),              # IRQ_NONE
    (7_000_008_000, 0, "DMA", 1, 0x200000, 2048, 1, 0),                # unmap
    (7_000_009_000, 0, "DMA", 4, 0x300000, 512, 2, 0),                 # map-sg, from-device
    (7_000_010_000, 0, "DMA", 9, 0x400000, 64, 7, 0),                  # a newer tracer's kind
]
DEV = "0000:00:05.0"


def extras_recording(path: Path) -> Path:
    """A MAP, a read, the EXTRAS and a write after them, recorded."""
    from mmiotrace_ng.format.records import NgRecDma, NgRecIrq, NgRecType

    recs = [mapping(6_000_000_000, 0, 1, BAR0, 0x100000),
            access(6_000_001_000, 0, MMIOTNG_OP_READ, BAR0, 0x010000ED)]
    for e in EXTRAS:
        if e[2] == "IRQ":
            r = NgRecIrq(irq=e[3], exit=e[4], ret=e[5], dev=DEV.encode(), handler=e[6].encode())
            r.hdr.type = NgRecType.NG_REC_IRQ
        else:
            r = NgRecDma(kind=e[3], addr=e[4], size=e[5], dir=e[6], phys=e[7], dev=DEV.encode())
            r.hdr.type = NgRecType.NG_REC_DMA
        r.hdr.ts_ns, r.hdr.cpu = e[0], e[1]
        recs.append(bytes(r))
    recs.append(access(7_000_011_000, 1, MMIOTNG_OP_WRITE, BAR0 + 4, 5))
    w = rawfile.RawWriter(str(path))
    w.meta({"kernel": "6.1.0-test", "host": "testbox"})
    w.header("VERSION 20070824\n" + PCIDEV)
    w.records(recs)
    w.end(0, 0, KALLSYMS, None)
    w.close()
    return path


EXTRA_KEYS = ("kind", "ts_ns", "cpu", "bdf", "irq", "event", "handler", "result", "dma_addr",
              "length", "direction", "phys", "map_id", "value", "width", "bar", "text",
              "section")


def extra_rows(text: bool) -> list[dict]:
    """The rows EXTRAS make, from EXTRAS (a text trace: no CPU, times to the
    microsecond, no memory address)."""
    kinds = ("map", "unmap", "alloc", "free", "map-sg", "unmap-sg")
    ways = ("bidirectional", "to-device", "from-device", "none")
    rows = []
    for e in EXTRAS:
        row = dict.fromkeys(EXTRA_KEYS)
        row.update(kind=e[2], ts_ns=e[0] // 1000 * 1000 if text else e[0],
                   cpu=None if text else e[1], bdf=DEV)
        if e[2] == "IRQ":
            row.update(irq=e[3], event="exit" if e[4] else "enter")
            if e[4]:
                row["result"] = "handled" if e[5] else "none"
            else:
                row["handler"] = e[6]
        else:
            row.update(event=kinds[e[3]] if e[3] < len(kinds) else f"kind-{e[3]}",
                       dma_addr=e[4], length=e[5],
                       direction=ways[e[6]] if e[6] < len(ways) else f"dir-{e[6]}",
                       phys=None if text or not e[7] else e[7])
        rows.append(row)
    return rows


@pytest.mark.parametrize("kind", ["recording", "text of report --irq --dma"])
def test_interrupts_and_dma_are_rows_of_their_own(kind, tmp_path, capsys):
    """A recording's IRQ and DMA records (and the MARK lines `report --irq
    --dma` prints for them) are IRQ and DMA rows, each column from the
    record; they start no section and leave the accesses' rows as they were."""
    src = extras_recording(tmp_path / "x.rec")
    if kind != "recording":
        status, out, err = run_main(["report", "--irq", "--dma", str(src)], capsys)
        assert (status, err) == (0, "")
        src = tmp_path / "x.txt"
        src.write_text(out)
    got = export(src, tmp_path / "out", capsys)["records"]
    assert [r["kind"] for r in got] == ["MAP", "R", *(e[2] for e in EXTRAS), "W"]
    assert pick(got[2:-1], EXTRA_KEYS) == extra_rows(kind != "recording")
    r, w = got[1], got[-1]
    assert (r["register"], r["value"], w["register"], w["value"]) == ("ID", 0x010000ED,
                                                                      "LIVENESS", 5)
    assert w["section"] is None and w["irq"] is None and w["event"] is None


def test_interrupt_handlers_are_queried(tmp_path, capsys):
    """What a user asks of them in SQL: each handler run's result and
    duration, the DMA still mapped at the end."""
    duckdb()
    src = extras_recording(tmp_path / "x.rec")
    runs = query(src, """
        SELECT irq, handler, result, exit_ns - enter_ns AS ns FROM (
            SELECT irq, handler, ts_ns AS enter_ns,
                   lead(ts_ns) OVER (PARTITION BY irq ORDER BY seq) AS exit_ns,
                   lead(result) OVER (PARTITION BY irq ORDER BY seq) AS result, event
            FROM records WHERE kind = 'IRQ') WHERE event = 'enter' ORDER BY enter_ns""",
                 capsys=capsys)
    assert runs == [{"irq": 24, "handler": "edu_exerciser", "result": "handled", "ns": 1000},
                    {"irq": 24, "handler": "edu_exerciser", "result": "none", "ns": 1000}]
    mapped = query(src, """
        SELECT printf('0x%x', dma_addr) AS addr FROM records WHERE kind = 'DMA'
        GROUP BY dma_addr
        HAVING count(*) FILTER (WHERE event IN ('map', 'alloc', 'map-sg'))
             > count(*) FILTER (WHERE event IN ('unmap', 'free', 'unmap-sg'))
        ORDER BY dma_addr""", capsys=capsys)
    assert mapped == [{"addr": "0x100000"}, {"addr": "0x300000"}]
