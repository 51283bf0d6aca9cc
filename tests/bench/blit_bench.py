"""Blits larger than the ring, in one guest boot (run by tests/bench/blit).

1. rep_chunk: the helper emulates at most rep_chunk elements of a rep movs
   per fault (interrupts off), then lets the instruction fault again.  For
   each value, the cost per store of a 1 MiB memcpy_toio into edu's BAR 0
   under mmiotrace-ng (median of REPEAT runs), and the longest stretch with
   interrupts off that it implies (rep_chunk x the cost per store).
2. Blits kept: one memcpy_toio of 4, 16 and 64 MiB into a write-combining
   mapping of ivshmem's BAR 2, under `mmiotrace-ng record` at its default
   ring, and (4 MiB) under the kernel's mmiotrace at its default buffer size
   (with a trace_pipe reader): accesses made, kept, lost.
3. --compat of a 16 MiB blit against the kernel's tracer given a buffer that
   holds all of it: the two streams' access lines (ours: record, then
   report --compat), without time stamps and map ids, compared (cmp).

Prints JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))
import guest_bench as gb  # noqa: E402
from sustained_bench import wait_ready  # noqa: E402

from mmiotrace_ng.common import ringbuf  # noqa: E402
from mmiotrace_ng.format.rawfile import ACCESS_SIZE, open_recording  # noqa: E402

CHUNKS = (1, 4, 16, 64, 256, 1024, 4096)
CHUNK_BYTES = 0xFF000           # edu: the exerciser's largest cloop
REPEAT = 3
BLIT_MIB = (4, 16, 64)
# the kernel's tracer keeps what its buffer holds of one blit (~32500 stores
# at its default size) and takes 4x longer per store: 4 MiB shows it
KERNEL_BLIT_MIB = (4,)
COMPAT_MIB = 16
REP_CHUNK = Path("/sys/module/mmiotng/parameters/rep_chunk")
IVSHMEM_ID = "1af4 1110"
DRIVER = Path("/sys/bus/pci/drivers/edu_exerciser")


def log(msg: str) -> None:
    print(f"blit: {msg}", file=sys.stderr, flush=True)


def ivshmem_64m() -> str:
    """The ivshmem-plain device with a 64 MiB BAR 2, bound to the exerciser."""
    for dev in sorted(Path("/sys/bus/pci/devices").iterdir()):
        ids = [(dev / f).read_text().strip() for f in ("vendor", "device")]
        res = (dev / "resource").read_text().splitlines()
        start, end = (int(x, 16) for x in res[2].split()[:2])
        if ids == ["0x1af4", "0x1110"] and end - start + 1 == 64 << 20:
            break
    else:
        raise RuntimeError("no 64 MiB ivshmem-plain device (tests/bench/blit adds one)")
    if not (DRIVER / dev.name).exists():
        try:
            (DRIVER / "new_id").write_text(IVSHMEM_ID + "\n")
        except FileExistsError:
            (DRIVER / "bind").write_text(dev.name)
    return dev.name


def blit(bdf: str, mib: int) -> int:
    """One memcpy_toio of mib MiB into BAR 2; its duration in ns."""
    path = Path("/sys/kernel/debug") / f"edu_exerciser-{bdf}" / "blit"
    fd = os.open(path, os.O_WRONLY)
    try:
        t0 = time.perf_counter_ns()
        os.write(fd, f"2 {mib << 20}\n".encode())
        return time.perf_counter_ns() - t0
    finally:
        os.close(fd)


def chunk_sweep(edu: str) -> list[dict]:
    stores = gb.accesses("cloop", CHUNK_BYTES)
    before = REP_CHUNK.read_text()
    ng = gb.NgTracer(edu, [], "chunks").start()
    rows = []
    try:
        for n in CHUNKS:
            REP_CHUNK.write_text(f"{n}\n")
            ng.run("cloop", CHUNK_BYTES)        # warm-up
            runs = [ng.run("cloop", CHUNK_BYTES) for _ in range(REPEAT)]
            ns = statistics.median(r.ns for r in runs) / stores
            rows.append({"rep_chunk": n, "ns_per_store": round(ns),
                         "irqs_off_us": round(n * ns / 1000, 1),
                         "complete": all(r.complete for r in runs)})
            log(f"rep_chunk {n}: {rows[-1]}")
    finally:
        ng.stop()
        REP_CHUNK.write_text(before)
    return rows


def ng_record_blit(bdf: str, mib: int) -> dict:
    gb.WORK.mkdir(exist_ok=True)
    path, errf = gb.WORK / "blit.rec", gb.WORK / "blit-rec.err"
    with open(errf, "wb") as err:
        proc = subprocess.Popen([*gb.NG, "record", "--pci", f"{bdf}@2", "-o", str(path)],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    wait_ready(proc, errf)
    ns = blit(bdf, mib)
    os.kill(proc.pid, signal.SIGINT)
    if proc.wait(900) != 0:
        raise RuntimeError("record failed: " + errf.read_text())
    rec = open_recording(str(path))
    kept = sum(ringbuf.committed(view, ACCESS_SIZE)[1] for view in rec.ring_chunks())
    out = row(mib, ns, kept, rec.end["lost"] if rec.end else -1)
    out["file_mb"] = round(path.stat().st_size / 1e6, 1)
    path.unlink()
    return out


def kernel_blit(bdf: str, mib: int) -> dict:
    kt = gb.KernelTracer(gb.kernel_default_buffer_kb()).start()
    try:
        kt.pump()
        before = kt.counter.snapshot()
        kt.seq += 1
        ns = blit(bdf, mib)
        kt._wait_end(kt.seq)
        d = kt.counter.snapshot().minus(before)
    finally:
        kt.stop()
    return row(mib, ns, d.access, d.lost)


def row(mib: int, ns: int, kept: int, lost: int) -> dict:
    made = (mib << 20) // 4
    return {"mib": mib, "stores": made, "seconds": round(ns / 1e9, 1),
            "store_rate": round(made / (ns / 1e9)), "kept": kept, "lost": lost,
            "kept_whole": kept == made and lost == 0}


def wait_for(path: Path, token: bytes, timeout: float = 900) -> None:
    """Until the file's last 64 KiB hold token (a marker, written again
    every 5 s: a full buffer may have dropped it)."""
    deadline = time.monotonic() + timeout
    again = time.monotonic() + 5
    while True:
        if time.monotonic() > again:
            gb.write_file(gb.MARKER, token.decode() + "\n")
            again = time.monotonic() + 5
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 65536))
            if token in f.read():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{token!r} never reached {path}")
        time.sleep(0.5)


# the access lines without their time stamps and map ids (awk, not Python:
# millions of lines under TCG)
NORMALIZE = ('$1 == "R" || $1 == "W" { $3 = ""; $4 = ""; print } '
             '$1 == "UNKNOWN" { $2 = ""; $3 = ""; print }')


def compat_equal(bdf: str) -> dict:
    """The kernel's stream and mmiotrace-ng --compat's of one 16 MiB blit."""
    gb.WORK.mkdir(exist_ok=True)
    texts = {}
    stores = (COMPAT_MIB << 20) // 4
    # ~50 bytes per event in the kernel's buffer: room for all of them
    kt = gb.KernelTracer(stores * 64 // 1024)
    kfile = gb.WORK / "kernel.txt"
    kt.start()
    kt.reader.stop()        # a cat reads trace_pipe into a file instead
    kt.reader = None
    with open(kfile, "wb") as out:
        cat = subprocess.Popen(["cat", str(gb.TRACING / "trace_pipe")], stdout=out)
        try:
            blit(bdf, COMPAT_MIB)
            gb.write_file(gb.MARKER, "blit-compat-end\n")
            wait_for(kfile, b"blit-compat-end")
        finally:
            cat.terminate()
            cat.wait(60)
            kt.stop()
    texts["kernel"] = kfile
    # record keeps the whole blit (a live text stream's renderer would
    # not keep up); report --compat prints what the live --compat text
    # would (test_render_of_raw_is_the_live_text)
    rec, errf = gb.WORK / "compat.rec", gb.WORK / "ng-compat.err"
    with open(errf, "wb") as err:
        proc = subprocess.Popen([*gb.NG, "record", "--pci", f"{bdf}@2", "-o", str(rec)],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    wait_ready(proc, errf)
    blit(bdf, COMPAT_MIB)
    os.kill(proc.pid, signal.SIGINT)
    if proc.wait(900) != 0:
        raise RuntimeError("record failed: " + errf.read_text())
    nfile = gb.WORK / "ng.txt"
    with open(nfile, "wb") as out:
        subprocess.run([*gb.NG, "report", "--compat", str(rec)], stdout=out, check=True)
    rec.unlink()
    texts["ng"] = nfile
    out: dict = {"mib": COMPAT_MIB, "stores": stores}
    for name, path in texts.items():
        norm = path.with_suffix(".norm")
        with open(norm, "wb") as out_f:
            subprocess.run(["awk", NORMALIZE, str(path)], stdout=out_f, check=True)
        out[f"{name}_access_lines"] = int(subprocess.run(
            ["wc", "-l", str(norm)], capture_output=True, text=True, check=True).stdout.split()[0])
        out[f"{name}_lost_lines"] = sum(1 for ln in open(path, errors="replace")
                                        if "Lost" in ln or "LOST" in ln)
    out["equal"] = subprocess.run(["cmp", "-s", str(kfile.with_suffix(".norm")),
                                   str(nfile.with_suffix(".norm"))]).returncode == 0
    for path in (*texts.values(), *(p.with_suffix(".norm") for p in texts.values())):
        path.unlink()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="chunks,kept,compat",
                    help="comma-separated: chunks, kept, compat (default: all)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    gb.load_exerciser()
    edu = gb.find_edu()
    bdf = ivshmem_64m()
    out: dict = {"cpu": gb.cpu_model(), "kernel": os.uname().release,
                 "chunk_bytes": CHUNK_BYTES, "repeat": REPEAT}
    if "chunks" in parts:
        out["rep_chunk"] = chunk_sweep(edu)
    if "kept" in parts:
        out["kept"] = {"ng_record": [], "kernel_mmiotrace": []}
        for mib in BLIT_MIB:
            out["kept"]["ng_record"].append(ng_record_blit(bdf, mib))
            log(f"record, {mib} MiB: {out['kept']['ng_record'][-1]}")
        for mib in KERNEL_BLIT_MIB:
            out["kept"]["kernel_mmiotrace"].append(kernel_blit(bdf, mib))
            log(f"kernel, {mib} MiB: {out['kept']['kernel_mmiotrace'][-1]}")
    if "compat" in parts:
        out["compat"] = compat_equal(bdf)
        log(f"compat: {out['compat']}")
    out["kernel_log_problems"] = gb.kernel_log_problems()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
