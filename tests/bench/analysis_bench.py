"""Host speed of the tools that read traces, records per second on one core:
report (a recording rendered to text) and diff (two equal traces compared,
text and recorded).  Prints JSON on stdout (tests/bench/sustained keeps it
in results.json under "analysis"), progress on stderr."""

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
sys.path.insert(0, str(REPO))
from render_bench import synthetic_access_records  # noqa: E402

from mmiotrace_ng.common import ringbuf  # noqa: E402
from mmiotrace_ng.format import rawfile  # noqa: E402

RECORDS = 2_000_000
BATCH = 100_000
HEADER = "VERSION 20070824\n"


def log(msg: str) -> None:
    print(f"analysis: {msg}", file=sys.stderr, flush=True)


def recording(path: Path, n: int) -> None:
    """n synthetic access records, recorded as record writes them."""
    w = rawfile.RawWriter(str(path))
    w.meta({"format": 2})
    w.header(HEADER)
    batch = synthetic_access_records(BATCH)
    for _ in range(n // BATCH):
        w.ring(memoryview(ringbuf.pack(batch)))
    w.end(0, 0, None, None)
    w.close()


def timed(argv: list[str], stdout: int | None = subprocess.DEVNULL) -> float:
    """Seconds the command took on one core (taskset), which must succeed."""
    t0 = time.perf_counter()
    res = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "mmiotrace_ng", *argv],
                         stdout=stdout, stderr=subprocess.PIPE, cwd=REPO)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{argv}: exit {res.returncode}: {res.stderr.decode()}")
    return took


def main() -> int:
    out: dict = {"records": RECORDS, "cpu": os.uname().machine}
    with tempfile.TemporaryDirectory() as tmp:
        rec, text = Path(tmp, "a.rec"), Path(tmp, "a.txt")
        recording(rec, RECORDS)
        log(f"report of {RECORDS} records")
        with open(text, "wb") as fh:
            took = timed(["report", str(rec)], stdout=fh.fileno())
        out["report_records_per_s"] = round(RECORDS / took)
        copy = Path(tmp, "b.txt")
        copy.write_bytes(text.read_bytes())
        for label, a, b in (("text", text, copy), ("recorded", rec, rec)):
            log(f"diff of two equal {label} traces")
            took = timed(["diff", str(a), str(b)])
            out[f"diff_{label}_records_per_s"] = round(RECORDS / took)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
