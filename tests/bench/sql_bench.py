"""Host speed and memory of export --parquet and query --top-registers on a
synthetic recording of 10 M access records, beside report of the same file:
records/s on one core (taskset) and the peak resident memory of each run
(getrusage of the child).  Prints JSON on stdout, progress on stderr.

    .venv/bin/python tests/bench/sql_bench.py [RECORDS]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from analysis_bench import BATCH, recording  # noqa: E402

RECORDS = 10_000_000


def log(msg: str) -> None:
    print(f"sql: {msg}", file=sys.stderr, flush=True)


def measured(argv: list[str]) -> tuple[float, int]:
    """Seconds the command took on one core and its peak RSS in KiB (it
    must succeed; its output is thrown away)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "mmiotrace_ng",
                                 *argv], stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)     # this child's own rusage
        took = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{argv}: exit {proc.returncode}: {err.read().decode()}")
    return took, usage.ru_maxrss


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else RECORDS
    n -= n % BATCH
    out: dict = {"records": n, "cpu": os.uname().machine}
    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp, "a.rec")
        log(f"a recording of {n} records")
        recording(rec, n)
        for label, argv in (("report", ["report", str(rec)]),
                            ("export_parquet", ["export", "--parquet", str(Path(tmp, "pq")),
                                                str(rec)]),
                            ("query_top_registers", ["query", str(rec), "--top-registers"]),
                            ("query_top_registers_of_export",
                             ["query", str(Path(tmp, "pq")), "--top-registers"])):
            log(label)
            took, rss = measured(argv)
            out[f"{label}_records_per_s"] = round(n / took)
            out[f"{label}_s"] = round(took, 2)
            out[f"{label}_peak_rss_mib"] = round(rss / 1024)
        out["parquet_bytes"] = sum(p.stat().st_size for p in Path(tmp, "pq").iterdir())
        out["recording_bytes"] = rec.stat().st_size
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
