"""The flight recorder's boot: one guest that dies several times on purpose.

tests/run boots a guest with reserved memory for the flight recorder
(memmap=) and for ramoops, and lets it reboot within the same QEMU (RAM is
kept across the reset).  This script runs at every boot:

1. After a crash, it saves what `mmiotrace-ng recover` says (the text, a
   recording, its stderr) and what ramoops kept of the dying kernel's log,
   then lets the records go (recover --clear).
2. It runs the next crash: the tracer with --flight, the exerciser's
   COUNT writes of known values pinned to CPU 1, then the death: panic(),
   an oops (and a reboot by sysrq-b, as a user would), interrupts off for
   ever (the RCU stall detector panics).  Last, --sync without the flight
   recorder: a loop of writes whose machine is killed hard (QEMU quits, and
   tests/vm/run boots it again in a new one).
3. When every crash has been recovered, it runs tests/guest/test_flight.py
   over what was saved, and its exit status is the guest's.

State between boots: tests/artifacts/flight/next, the next step (and the
checks' status once they ran: a reset after them repeats it); the checkout's
9p share writes through to the host before the crash.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kernel_tracer import find_pci_device  # noqa: E402
from ng_tracer import ARTIFACTS, NG, NgTracer  # noqa: E402

# NG_FLIGHT_CRASHES=sync (say) runs some only; NG_SYNC_OPTION= (empty) runs
# the --sync loop without --sync, which must fail its test (the loop outruns
# the tracer): experiments only, tests/run sets neither
CRASHES = os.environ.get("NG_FLIGHT_CRASHES", "panic,oops,lockup,sync").split(",")
SYNC_OPTION = os.environ.get("NG_SYNC_OPTION", "--sync")
COUNT = 5000            # writes before each death: more than the ring keeps
RECS = 4096             # --flight N
CPU = 1                 # where the writes run
LOCKUP_WAIT = 90        # s: the RCU stall detector (timeout 3 s) panics well before
SYS_MEMBARRIER = 324    # x86_64
MEMBARRIER_CMD_GLOBAL = 1
SYNC_SECONDS = 4        # --sync: how long the loop runs before QEMU quits
FLIGHT = ARTIFACTS / "flight"
NEXT = FLIGHT / "next"
EXERCISER_KO = HERE.parent / "drivers" / "edu_exerciser" / "edu_exerciser.ko"
DEBUGFS = Path("/sys/kernel/debug/edu_exerciser")


def log(msg: str) -> None:
    print(f"flight_boot: {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=False, capture_output=True, text=True, **kw)


def save_recovered(name: str) -> None:
    """What recover says of the last crash, and ramoops' copy of its log."""
    txt = sh(*NG, "recover", "-o", str(FLIGHT / f"{name}.rec"), "--clear")
    (FLIGHT / f"{name}.txt").write_text(txt.stdout)
    (FLIGHT / f"{name}.err").write_text(f"exit {txt.returncode}\n{txt.stderr}")
    pstore = Path("/sys/fs/pstore")
    sh("mount", "-t", "pstore", "pstore", str(pstore))
    dumps = sorted(pstore.glob("dmesg-ramoops-*"))
    (FLIGHT / f"{name}.pstore").write_text(
        "".join(p.read_text(errors="replace") for p in dumps))
    for p in pstore.iterdir():
        p.unlink(missing_ok=True)       # ramoops' records of this crash go
    log(f"{name}: recover exit {txt.returncode}, {len(txt.stdout.splitlines())} lines, "
        f"{len(dumps)} ramoops dumps")


def write_crash(how: str) -> subprocess.Popen:
    """The exerciser's writes and death, on CPU, from a process of its own."""
    return subprocess.Popen(["taskset", "-c", str(CPU), "sh", "-c",
                             f"echo '{how} {COUNT}' > {DEBUGFS}/crash"])


def kill_during_loop() -> None:
    """--sync: a loop of single writes (wval i: i to BAR0 + 0x80), every
    16th followed by its number in a file, until the machine is killed hard:
    QEMU quits at once (isa-debug-exit, tests/vm/run --reboot) after
    SYNC_SECONDS, wherever the loop is."""
    count = os.open(FLIGHT / "sync.count", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    run = os.open(DEBUGFS / "run", os.O_WRONLY)
    port = os.open("/dev/port", os.O_WRONLY)

    def kill() -> None:
        time.sleep(SYNC_SECONDS)
        os.pwrite(port, b"\x31", 0xF4)

    threading.Thread(target=kill, daemon=True).start()
    for i in range(1, 1 << 30):
        os.write(run, f"wval {i}\n".encode())
        if i % 16 == 0:     # the loop's own counter, now and then: the writes outrun a reader
            os.pwrite(count, f"{i}\n".ljust(16).encode(), 0)


def wait_for_grace_period() -> None:
    """membarrier(MEMBARRIER_CMD_GLOBAL): an RCU grace period, from user space."""
    time.sleep(1)           # the writer is spinning by then
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_MEMBARRIER, MEMBARRIER_CMD_GLOBAL, 0, 0) != 0:
        log(f"lockup: membarrier: {os.strerror(ctypes.get_errno())}")


def lockup_not_detected() -> None:
    """The stall detector did not panic: put what the kernel knows on the
    console (every CPU's stack, the blocked tasks) and die by sysrq-c, so
    that the boot goes on and test_flight fails, saying so, at once."""
    log(f"lockup: no RCU stall panic in {LOCKUP_WAIT} s: sysrq-l, sysrq-w, then sysrq-c")
    Path("/proc/sys/kernel/printk").write_text("8\n")
    for key in "lwc":
        Path("/proc/sysrq-trigger").write_text(f"{key}\n")
        time.sleep(2)


def crash(name: str) -> None:
    dev = find_pci_device(0x1234, 0x11E8)
    if dev is None:
        raise SystemExit("flight_boot: no edu device")
    sh("rmmod", "edu_exerciser")
    res = sh("insmod", str(EXERCISER_KO), "allow_crash=1")
    if res.returncode:
        raise SystemExit(f"flight_boot: insmod: {res.stderr}")
    if name == "sync":
        tracer = NgTracer(["--pci", dev.name, *SYNC_OPTION.split()], "flight/sync").start()
        log("sync: tracing with --sync, QEMU quits in the middle of a loop")
        kill_during_loop()
    tracer = NgTracer(["--pci", dev.name, "--flight", str(RECS)], f"flight-{name}").start()
    log(f"{name}: tracing {dev.name}, the machine dies now")
    sh("sync")
    if name == "lockup":
        Path("/proc/sys/kernel/panic_on_rcu_stall").write_text("1\n")
        Path("/sys/module/rcupdate/parameters/rcu_cpu_stall_timeout").write_text("3\n")
    proc = write_crash(name)
    if name == "lockup":
        # The RCU stall detector sees the spinning CPU only while a grace
        # period waits for it: an idle 7.2 may start none for minutes.
        # membarrier(GLOBAL) is synchronize_rcu() and nothing else (no
        # work queued on the spinning CPU, no IPI): it waits for ever, in a
        # thread of its own, while this one keeps the time.
        threading.Thread(target=wait_for_grace_period, daemon=True).start()
        time.sleep(LOCKUP_WAIT)
        lockup_not_detected()
    proc.wait(timeout=600)          # the oops kills the writer; the others never return
    time.sleep(2)
    log(f"{name}: the writer ended ({proc.returncode}): reboot as a user would (sysrq-b)")
    Path("/proc/sysrq-trigger").write_text("b\n")
    time.sleep(600)
    tracer.proc.kill()
    raise SystemExit(f"flight_boot: {name}: the machine lived on")


def main() -> int:
    FLIGHT.mkdir(parents=True, exist_ok=True)
    step = int(NEXT.read_text().split()[0]) if NEXT.exists() else 0
    sh("modprobe", "ramoops")
    if 0 < step <= len(CRASHES) and CRASHES[step - 1] != "sync":
        save_recovered(CRASHES[step - 1])   # (a new QEMU after sync: RAM lost)
    if step < len(CRASHES):
        NEXT.write_text(f"{step + 1}\n")
        os.sync()
        crash(CRASHES[step])
    if step > len(CRASHES):     # a reset after the checks ran: their status stands
        return int(NEXT.read_text().split()[1])
    rc = subprocess.run([sys.executable, "-m", "pytest", *sys.argv[1:],
                         str(HERE / "test_flight.py")], check=False).returncode
    NEXT.write_text(f"{step + 1} {rc}\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
