"""`mmiotrace-ng query FILE ['SQL']`: SQL over a trace's tables, run by
DuckDB embedded in the process.

FILE is a trace (text or recorded: converted on the fly by table.py into
Parquet files in a temporary directory, in constant memory) or a directory
that `export --parquet` wrote.  The tables (docs/sql.md) are views over the
Parquet files: records, devices, mappings.  --before MARK and --between
MARK1 MARK2 narrow the records view to the rows before the first MARK line
of that text, or between the first MARK1 and the first MARK2 after it;
every query, named or given, then sees only those (all_records keeps them
all).

The named queries (NAMED) answer the common questions; without SQL and
without one of them the records are listed (ORDER BY seq).  Output is an
aligned table, CSV (--csv) or JSON (--json: an array of objects).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any, Final

from ..common.errors import UsageError
from ..common.helpformat import ExamplesFormatter
from ..common.output import writing
from .accesses import note_unapplied, open_trace, register_namer
from .extras import require
from .tablefiles import table_files

FETCH: Final = 10000               # rows fetched at a time
NULL_CELL: Final = "-"             # NULL in the aligned table
MAX_TEXT: Final = 120              # characters of a cell in the aligned table

# Columns the named queries show; addresses and values in hex, times in
# seconds with microseconds as the trace prints them.
_TIME: Final = "printf('%.6f', ts_ns / 1e9)"
_PLACE: Final = ("bdf, bar, CASE WHEN bar_offset IS NULL THEN NULL "
                 "ELSE printf('0x%x', bar_offset) END AS offset, "
                 "printf('0x%x', phys) AS phys, register")
_FUNCTION: Final = ("CASE WHEN symbol IS NOT NULL THEN "
                    "symbol || coalesce(' [' || module || ']', '') "
                    "WHEN pc IS NOT NULL THEN printf('0x%x', pc) END")

NAMED: Final[dict[str, str]] = {
    # the registers accessed most: one row per register, op and width
    "top_registers": """
SELECT bdf, bar, CASE WHEN bar_offset IS NULL THEN NULL ELSE printf('0x%x', bar_offset) END
       AS offset, printf('0x%x', phys) AS phys, register, kind, width, count(*) AS count,
       printf('0x%x', arg_max(value, seq)) AS last
FROM records
WHERE kind IN ('R', 'W')
GROUP BY bdf, bar, bar_offset, phys, register, kind, width
ORDER BY count DESC, phys, kind, width""",
    # runs of one read repeated (same instruction, address, width and value)
    # on one CPU with nothing else on that CPU between: the longest first
    "polls": f"""
WITH ordered AS (
    SELECT *, row_number() OVER (PARTITION BY cpu ORDER BY seq) AS n_cpu FROM records
), runs AS (
    SELECT *, n_cpu - row_number() OVER (PARTITION BY cpu, kind, pc, phys, width, value
                                         ORDER BY seq) AS run
    FROM ordered
)
SELECT count(*) AS reads, round((max(ts_ns) - min(ts_ns)) / 1e3, 3) AS duration_us,
       printf('%.6f', min(ts_ns) / 1e9) AS start, cpu, any_value({_FUNCTION}) AS function,
       {_PLACE}, width, printf('0x%x', value) AS value, min(seq) AS seq
FROM runs
WHERE kind = 'R'
GROUP BY cpu, pc, phys, width, value, run, bdf, bar, bar_offset, register, symbol, module
HAVING count(*) >= 2
ORDER BY duration_us DESC, reads DESC, seq""",
    # the last access of each register (address): what it held last
    "last_values": f"""
SELECT {_PLACE}, kind, width, printf('0x%x', value) AS value, {_TIME} AS time,
       {_FUNCTION} AS function, section, seq
FROM records
WHERE kind IN ('R', 'W')
QUALIFY row_number() OVER (PARTITION BY phys ORDER BY seq DESC) = 1
ORDER BY phys""",
    # the records themselves, in file order
    "records": f"""
SELECT seq, {_TIME} AS time, cpu, kind, width, {_PLACE},
       CASE WHEN value IS NULL THEN NULL ELSE printf('0x%x', value) END AS value, fields,
       {_FUNCTION} AS function, coalesce(text, insn) AS text
FROM records
ORDER BY seq""",
}


EXAMPLES = """\
examples:
  mmiotrace-ng query load.rec --top-registers
  mmiotrace-ng query load.rec --last-values --before 'init end'
  mmiotrace-ng query load.rec --between 'init begin' 'init end' --csv
  mmiotrace-ng query load.rec "SELECT register, count(*) FROM records WHERE kind = 'W' GROUP BY ALL"
  mmiotrace-ng export --parquet load.parquet load.rec
  mmiotrace-ng query load.parquet --polls --json"""


def setup(ap: argparse.ArgumentParser) -> None:
    ap.formatter_class = ExamplesFormatter
    ap.epilog = EXAMPLES
    ap.add_argument("file", metavar="FILE",
                    help="a trace (text or recorded; - for standard input), or a directory "
                         "export --parquet wrote")
    ap.add_argument("sql", nargs="?", metavar="SQL",
                    help="the query: tables records, devices, mappings (docs/sql.md)")
    named = ap.add_mutually_exclusive_group()
    named.add_argument("--top-registers", action="store_const", const="top_registers",
                       dest="named", help="the registers accessed most: count and last "
                                          "value per register, op and width")
    named.add_argument("--polls", action="store_const", const="polls", dest="named",
                       help="the longest polling runs (one read repeated on one CPU), with "
                            "their function")
    named.add_argument("--last-values", action="store_const", const="last_values",
                       dest="named", help="the last value read or written of each register")
    ap.add_argument("--before", metavar="MARK",
                    help="only the records before the first MARK line with this text")
    ap.add_argument("--between", nargs=2, metavar=("MARK1", "MARK2"),
                    help="only the records between the first MARK1 line and the first "
                         "MARK2 line after it")
    ap.add_argument("--limit", type=int, metavar="N",
                    help="at most N rows (default: all)")
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV, with a header line")
    fmt.add_argument("--json", action="store_true", help="JSON: an array of objects")
    ap.add_argument("--regs", action="append", default=[], metavar="MAP",
                    help="register map (for a trace converted on the fly): a .regs file or "
                         "the name of a shipped one (e1000, edu); repeatable; default: every "
                         "shipped map, each where its device is in the trace")
    ap.add_argument("-o", "--output", metavar="OUT", help="write here, not stdout (- : stdout)")


def run(args: argparse.Namespace) -> int:
    if args.sql is not None and args.named is not None:
        raise UsageError("give SQL or a named query (--top-registers, --polls, "
                         "--last-values), not both")
    if args.before is not None and args.between is not None:
        raise UsageError("--before and --between do not go together")
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit takes a number of rows, 0 or more")
    # a directory without an export's files is refused as every reader does
    exported = os.path.isdir(args.file) and table_files(args.file) is not None
    trace = None if exported else open_trace(args.file)
    require("query", ("duckdb",) if exported else ("duckdb", "pyarrow", "numpy"))
    sql = args.sql if args.sql is not None else NAMED[args.named or "records"]
    if exported:
        return _query(args, table_files(args.file), sql)
    from .table import write_parquet

    namer = register_namer(args.regs)
    with tempfile.TemporaryDirectory(prefix="mmiotrace-ng-query-") as tmp:
        write_parquet(trace, tmp, namer, compression="lz4")
        note_unapplied(namer, args.regs, "query")
        return _query(args, table_files(tmp), sql)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect(files: dict[str, str]):  # -> duckdb.DuckDBPyConnection
    """A DuckDB connection with the views all_records, records, devices
    and mappings over the files."""
    import duckdb

    from .table import SCHEMAS

    con = duckdb.connect(":memory:")
    for name, path in files.items():
        view = "all_records" if name == "records" else name
        if os.path.isfile(path):
            con.execute(f"CREATE VIEW {view} AS SELECT * FROM read_parquet({_literal(path)})")
        else:       # an empty table of the same columns
            import pyarrow as pa

            empty = pa.Table.from_pylist([], schema=SCHEMAS[name])
            con.register(f"{view}_empty", empty)
            con.execute(f"CREATE VIEW {view} AS SELECT * FROM {view}_empty")
    con.execute("CREATE VIEW records AS SELECT * FROM all_records")
    return con


def _first_mark(con, text: str, after: int = -1) -> int | None:
    row = con.execute("SELECT min(seq) FROM all_records WHERE kind = 'MARK' AND text = ? "
                      "AND seq > ?", [text, after]).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def narrow(con, before: str | None, between: list[str] | None, name: str) -> None:
    """The records view as --before or --between make it."""
    if before is not None:
        end = _first_mark(con, before)
        if end is None:
            raise UsageError(f"no MARK line {before!r} in {name}")
        con.execute(f"CREATE OR REPLACE VIEW records AS SELECT * FROM all_records "
                    f"WHERE seq < {end}")
    elif between is not None:
        first, second = between
        start = _first_mark(con, first)
        if start is None:
            raise UsageError(f"no MARK line {first!r} in {name}")
        end = _first_mark(con, second, start)
        if end is None:
            raise UsageError(f"no MARK line {second!r} after {first!r} in {name}")
        con.execute(f"CREATE OR REPLACE VIEW records AS SELECT * FROM all_records "
                    f"WHERE seq > {start} AND seq < {end}")


def _query(args: argparse.Namespace, files: dict[str, str] | None, sql: str) -> int:
    import duckdb

    assert files is not None
    con = connect(files)
    name = "standard input" if args.file == "-" else args.file
    try:
        narrow(con, args.before, args.between, name)
        if args.limit is not None:
            sql = f"SELECT * FROM ({sql}) LIMIT {args.limit}"
        cur = con.execute(sql)
        columns = [d[0] for d in cur.description] if cur.description else []
        with writing(args.output) as out:
            text = io.TextIOWrapper(out, encoding="utf-8", errors="replace", newline="")
            try:
                rows = _rows(cur)
                if args.csv:
                    _csv(text, columns, rows)
                elif args.json:
                    _json(text, columns, rows)
                else:
                    _aligned(text, columns, rows)
                text.flush()
            finally:
                text.detach()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"query: {first}") from exc
    finally:
        con.close()
    return 0


def _rows(cur) -> Iterator[tuple]:
    while batch := cur.fetchmany(FETCH):
        yield from batch


def _cell(v: Any) -> str:
    if v is None:
        return NULL_CELL
    text = str(v).replace("\n", " ")
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


def _aligned(out: io.TextIOWrapper, columns: list[str], rows: Iterator[tuple]) -> None:
    """Columns padded to their widest cell (the rows are read first: a
    table for people is short); numbers to the right."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [any(row[i] != NULL_CELL for row in cells)
               and all(row[i] == NULL_CELL or _is_number(row[i]) for row in cells)
               for i in range(len(columns))]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w)
                 for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip() + "\n"

    out.write(line(columns))
    for row in cells:
        out.write(line(row))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _csv(out: io.TextIOWrapper, columns: list[str], rows: Iterator[tuple]) -> None:
    w = csv.writer(out, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow(["" if v is None else v for v in row])


def _json(out: io.TextIOWrapper, columns: list[str], rows: Iterator[tuple]) -> None:
    out.write("[")
    sep = "\n"
    for row in rows:
        out.write(sep + json.dumps(dict(zip(columns, row, strict=True)), default=str,
                                   ensure_ascii=False))
        sep = ",\n"
    out.write("\n]\n")
