"""Sustained rates, in one guest boot: what each tracer keeps of a long
one-CPU readl loop and of a framebuffer-style blit (memcpy_toio, i.e. rep
movsl stores), side by side: the kernel's mmiotrace (trace_pipe read as
cat would), mmiotrace-ng printing text into a pipe, and mmiotrace-ng record.

Run by tests/bench/sustained (tests/vm/run); prints JSON on stdout,
progress on stderr.  Each run counts the accesses the exerciser made and
the access records the tracer delivered, and the losses it reported.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import guest_bench as gb  # noqa: E402

from mmiotrace_ng.common import ringbuf  # noqa: E402
from mmiotrace_ng.format.rawfile import ACCESS_SIZE, open_recording  # noqa: E402

LOOP_CHUNK = 50_000               # readl per exerciser call in the sustained loop
FB_BYTES = 0xFF000                # the exerciser's largest memcpy_toio
FB_REPEAT = 4
CPU = 0


def log(msg: str) -> None:
    print(f"sustained: {msg}", file=sys.stderr, flush=True)


def readl_for(seconds: float) -> tuple[int, int]:
    """rloop calls on one CPU until `seconds` pass: (accesses, ns)."""
    made = ns = 0
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        ns += gb.run_scenario("rloop", LOOP_CHUNK)
        made += LOOP_CHUNK
    return made, ns


def blits() -> tuple[int, int]:
    made = ns = 0
    for _ in range(FB_REPEAT):
        ns += gb.run_scenario("cloop", FB_BYTES)
        made += gb.accesses("cloop", FB_BYTES)
    return made, ns


WORKLOADS = {"readl": readl_for, "blit": lambda seconds: blits()}


class PipeNg(gb.Tracer):
    """mmiotrace-ng printing its text into a pipe that a thread counts (as
    `mmiotrace-ng ... | cat > file` would)."""

    label = "mmiotrace-ng text"

    def __init__(self, bdf: str) -> None:
        super().__init__()
        self.errf = gb.WORK / "pipe-ng.err"
        gb.WORK.mkdir(exist_ok=True)
        with open(self.errf, "wb") as err:
            self.proc = subprocess.Popen([*gb.NG, "--pci", bdf], stdout=subprocess.PIPE,
                                         stderr=err, start_new_session=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        wait_ready(self.proc, self.errf)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(1 << 20):
            self.counter.feed(chunk)

    def stop(self) -> str:
        os.kill(self.proc.pid, signal.SIGINT)
        self.proc.wait(600)
        self.thread.join(60)
        return self.errf.read_text(errors="replace")


def wait_ready(proc: subprocess.Popen, errf: Path) -> None:
    deadline = time.monotonic() + gb.START_TIMEOUT
    while b"mmiotrace-ng: ready" not in errf.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("mmiotrace-ng did not start: " + errf.read_text())
        time.sleep(0.1)


def text_run(tracer: gb.Tracer, workload: str, seconds: float) -> dict:
    """A workload under a tracer whose text stream a counter reads."""
    tracer.pump()
    before = tracer.counter.snapshot()
    tracer.seq += 1
    made, ns = WORKLOADS[workload](seconds)
    tracer._wait_end(tracer.seq)
    d = tracer.counter.snapshot().minus(before)
    return result(made, ns, d.access, d.lost)


def record_run(bdf: str, workload: str, seconds: float) -> dict:
    """A workload under mmiotrace-ng record; the file's access records are
    counted afterwards."""
    gb.WORK.mkdir(exist_ok=True)
    path = gb.WORK / f"{workload}.rec"
    errf = gb.WORK / f"{workload}-rec.err"
    with open(errf, "wb") as err:
        proc = subprocess.Popen([*gb.NG, "record", "--pci", bdf, "-o", str(path)],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    wait_ready(proc, errf)
    made, ns = WORKLOADS[workload](seconds)
    os.kill(proc.pid, signal.SIGINT)
    if proc.wait(600) != 0:
        raise RuntimeError("record failed: " + errf.read_text())
    rec = open_recording(str(path))
    kept = sum(ringbuf.committed(view, ACCESS_SIZE)[1] for view in rec.ring_chunks())
    size = path.stat().st_size
    path.unlink()
    out = result(made, ns, kept, rec.end["lost"] if rec.end else -1)
    out["file_mb"] = round(size / 1e6, 1)
    return out


def result(made: int, ns: int, kept: int, lost: int) -> dict:
    return {"accesses": made, "seconds": round(ns / 1e9, 1),
            "access_rate": round(made / (ns / 1e9)), "kept": kept, "lost": lost,
            "kept_fraction": round(kept / made, 4)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="which, comma-separated (default: all)")
    args = ap.parse_args()
    gb.load_exerciser()
    bdf = gb.find_edu()
    os.sched_setaffinity(0, {CPU})
    out: dict = {"seconds": args.seconds, "loop_chunk": LOOP_CHUNK,
                 "blit": {"bytes": FB_BYTES, "repeat": FB_REPEAT}, "cpu": gb.cpu_model()}
    for workload in args.workloads.split(","):
        res: dict = {}
        log(f"{workload}: mmiotrace-ng record")
        res["ng_record"] = record_run(bdf, workload, args.seconds)
        log(f"{workload}: mmiotrace-ng text: {res['ng_record']}")
        ng = PipeNg(bdf)
        try:
            res["ng_text"] = text_run(ng, workload, args.seconds)
        finally:
            ng.stop()
        log(f"{workload}: kernel mmiotrace: {res['ng_text']}")
        kernel = gb.KernelTracer(gb.kernel_default_buffer_kb()).start()
        try:
            res["kernel_mmiotrace"] = text_run(kernel, workload, args.seconds)
        finally:
            kernel.stop()
        log(f"{workload}: {res['kernel_mmiotrace']}")
        out[workload] = res
    out["kernel_log_problems"] = gb.kernel_log_problems()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
