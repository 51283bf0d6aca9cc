"""Overload: a sustained access storm from both CPUs under mmiotrace-ng.

Run inside the test guest (see tests/storm).  The exerciser's burst scenario
(COUNT reads on each of two CPUs at once) runs back to back for --seconds
with mmiotrace-ng tracing the edu device at its default buffer size, its
output read from a pipe and counted line by line here (nothing is stored).
Checks: the records in the output plus the losses its "Lost N events" lines
report equal the records made, exactly, and agree with the tracer's own
summary; the tracer exits 0; afterwards every page of a mapping of the device
held across the run is present again (the page table, not the helper's
word), the helper holds no filter, mapping or armed page and the device
still works untraced; the tracer's RSS stays flat (sampled at least four
times, every 10 s at most); dmesg clean.  Exit status 0 when all hold.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import EXERCISER_DEBUGFS, EXERCISER_KO, KernelLog, bad_log_lines  # noqa: E402
from kernel_tracer import find_pci_device  # noqa: E402
from ng_tracer import NG, helper_status  # noqa: E402
from storm_count import LineCounter, verdict  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


HOLD = EXERCISER_DEBUGFS / "hold"


def held_present() -> tuple[int, int]:
    """(pages, present) of the exerciser's held mapping (see held.py)."""
    words = HOLD.read_text().split()
    return int(words[3]), int(words[5])


def left_whole() -> bool:
    """Every page of the held mapping present again within 10 s."""
    deadline = time.monotonic() + 10
    while (got := held_present())[1] != got[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    if got[1] != got[0]:
        print(f"storm: FAIL: {got[0] - got[1]} of {got[0]} held pages left not-present",
              file=sys.stderr)
        return False
    return True


def helper_idle() -> bool:
    """Nothing left in the helper, and the device works untraced."""
    st = helper_status()
    faults = st["faults"]
    (EXERCISER_DEBUGFS / "run").write_text("readl\n")
    after = helper_status()["faults"]
    if st["filters"] or st["mappings"] or st["armed_pages"] or st["owner"] or after != faults:
        print(f"storm: FAIL: the helper after the run: {st}, faults then {after}",
              file=sys.stderr)
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--count", type=int, default=20000, help="reads per CPU per burst")
    args = ap.parse_args()

    log = KernelLog()
    if not Path("/sys/module/edu_exerciser").exists():
        subprocess.run(["insmod", str(EXERCISER_KO)], check=True)
    dev = find_pci_device(0x1234, 0x11E8)
    HOLD.write_text("map")
    err = open("/tmp/storm.err", "w+")
    proc = subprocess.Popen([*NG, "--pci", dev.name], stdout=subprocess.PIPE, stderr=err)
    counter = LineCounter(proc.stdout)
    counter.start()
    while "mmiotrace-ng: ready" not in Path("/tmp/storm.err").read_text():
        if proc.poll() is not None:
            print(Path("/tmp/storm.err").read_text(), file=sys.stderr)
            return 1
        time.sleep(0.5)
    pid = proc.pid   # the shim execs python: the same process
    if held_present()[1]:
        print("storm: FAIL: ready, but the held mapping is not armed", file=sys.stderr)
        return 1
    every = min(10.0, args.seconds / 4)
    runs, t0, next_report, rss = 0, time.monotonic(), 0.0, []
    while time.monotonic() - t0 < args.seconds:
        (EXERCISER_DEBUGFS / "run").write_text(f"burst {args.count}\n")
        runs += 1
        now = time.monotonic() - t0
        if now >= next_report:
            rss.append(rss_kib(pid))
            print(f"storm: {now:6.0f} s, {runs} bursts, tracer RSS {rss[-1]} KiB",
                  file=sys.stderr, flush=True)
            next_report += every
    proc.send_signal(signal.SIGINT)
    status = proc.wait(600)
    counter.join(600)
    text = Path("/tmp/storm.err").read_text()
    k = counter.kinds
    made = runs * (2 * args.count + 2) + 1      # and the held mapping's MAP line
    print(f"storm: {runs} bursts, {made} records made; in the output: {k[b'R']} R, "
          f"{k[b'MAP']} MAP, {k[b'UNMAP']} UNMAP, {counter.lost} lost in {k[b'LOST']} lines; "
          f"RSS first {rss[0]} KiB, max {max(rss)} KiB, last {rss[-1]} KiB")
    failures = verdict(counter, made, status, text)
    for why in failures:
        print(f"storm: FAIL: {why}", file=sys.stderr)
    ok = not failures
    ok = left_whole() and ok
    HOLD.write_text("unmap")
    ok = helper_idle() and ok
    # flat: after warm-up (the first sample) it grows by less than 10 %
    if len(rss) < 3:
        print(f"storm: FAIL: {len(rss)} memory samples: too few to see growth", file=sys.stderr)
        ok = False
    elif max(rss[1:]) > 1.1 * rss[1]:
        print("storm: FAIL: the tracer's memory grows", file=sys.stderr)
        ok = False
    bad = bad_log_lines(log.all_lines())
    log.close()
    if bad:
        print("storm: FAIL: kernel log:\n" + "\n".join(bad), file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
