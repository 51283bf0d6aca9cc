"""mmiotrace-ng ksym against the truth: the exerciser writes and reads its
variable edu_watched a known number of times from two named functions
(the stress scenarios watch_write and watch_read), and Debian's perf counts
the same workload with its own hardware breakpoint (mem:ADDR/LEN:w|rw) in
the same boot."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest
from conftest import EXERCISER_DEBUGFS
from ng_tracer import NG, NgTracer

from mmiotrace_ng.common import bpfsys

STRESS = EXERCISER_DEBUGFS / "stress"
VAR = "edu_exerciser:edu_watched"
WRITES, READS = 1000, 700
WORKLOAD = (f"echo $$ > /tmp/ksym-pid; echo 'watch_write {WRITES}' > {STRESS}; "
            f"echo 'watch_read {READS}' > {STRESS}")
LINE = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(RW|W)\s+(.*)$")
CPU1 = Path("/sys/devices/system/cpu/cpu1/online")


def address(name: str, module: str) -> int:
    for line in Path("/proc/kallsyms").read_text().splitlines():
        parts = line.split()
        if parts[2] == name and parts[3:] == [f"[{module}]"]:
            return int(parts[0], 16)
    raise AssertionError(f"{name} [{module}] not in kallsyms")


def ksym(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NG, "ksym", *args], capture_output=True, text=True,
                          timeout=timeout)


def hits(stdout: str) -> list[tuple[str, ...]]:
    lines = stdout.splitlines()
    assert lines and lines[0] == "# TASK-PID CPU# Symbol Type Function", stdout[:300]
    out = []
    for ln in lines[1:]:
        m = LINE.match(ln)
        assert m, f"not a hit line: {ln!r}"
        out.append(m.groups())
    return out


def functions(rows: list[tuple[str, ...]]) -> dict[str, int]:
    count: dict[str, int] = {}
    for row in rows:
        fn = row[5].split("+", 1)[0] + (" [edu_exerciser]" if row[5].endswith(
            "[edu_exerciser]") else "")
        count[fn] = count.get(fn, 0) + 1
    return count


def perf_count(event: str, workload: str = WORKLOAD) -> int:
    res = subprocess.run(["perf", "stat", "-x,", "-a", "-e", event, "--", "sh", "-c",
                          workload], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    fields = res.stderr.strip().splitlines()[-1].split(",")
    assert fields[0].isdigit(), res.stderr
    return int(fields[0])


@pytest.fixture(scope="module")
def watched(exerciser) -> int:
    return address("edu_watched", "edu_exerciser")


@pytest.mark.parametrize(("op", "perf_op", "want"), [
    ("-w-", "w", {"edu_watch_writer [edu_exerciser]": WRITES}),
    ("rw-", "rw", {"edu_watch_writer [edu_exerciser]": WRITES,
                   "edu_watch_reader [edu_exerciser]": READS}),
])
def test_every_access_from_the_right_function(watched, op, perf_op, want):
    res = ksym(f"{VAR}:{op}", "--", "sh", "-c", WORKLOAD)
    assert res.returncode == 0, res.stderr
    rows = hits(res.stdout)
    pid = int(Path("/tmp/ksym-pid").read_text())
    assert functions(rows) == want, functions(rows)
    assert {(r[0], int(r[1]), r[3], r[4]) for r in rows} == {
        ("sh", pid, VAR, "RW" if op == "rw-" else "W")}
    assert re.search(rf"{sum(want.values())} hits printed .* lost 0$", res.stderr), res.stderr
    # perf's own hardware breakpoint on the same workload
    assert perf_count(f"mem:0x{watched:x}/4:{perf_op}") == sum(want.values())


@pytest.mark.parametrize("op", ["-w-", "rw-"])
def test_histogram_counts_in_the_kernel(exerciser, op):
    res = ksym(f"{VAR}:{op}", "--histogram", "--", "sh", "-c", WORKLOAD)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["Access_Type", "Symbol_name", "Function", "Counter"]
    rows = [ln.split() for ln in lines[1:]]
    typ = "RW" if op == "rw-" else "W"
    want = [[typ, VAR, "edu_watch_writer", "[edu_exerciser]", str(WRITES)]]
    if op == "rw-":
        want.append([typ, VAR, "edu_watch_reader", "[edu_exerciser]", str(READS)])
    assert rows == want, res.stdout


def test_histogram_interval_prints_the_counts_so_far(exerciser):
    """--histogram -i 1: a table every second, counts so far: one printed
    between the two loops has the first loop's 1000 writes, the last one
    both loops' 1500."""
    res = ksym(f"{VAR}:-w-", "--histogram", "-i", "1", "--", "sh", "-c",
               f"echo 'watch_write 1000' > {STRESS}; sleep 4; echo 'watch_write 500' > {STRESS}")
    assert res.returncode == 0, res.stderr
    counts: list[int] = []
    for ln in res.stdout.splitlines():
        f = ln.split()
        if f == ["Access_Type", "Symbol_name", "Function", "Counter"]:
            counts.append(0)
        elif counts and f[:3] == ["W", VAR, "edu_watch_writer"]:
            counts[-1] = int(f[-1])
    assert len(counts) >= 2 and 1000 in counts and counts[-1] == 1500, counts
    assert counts == sorted(counts), counts


def test_losses_are_counted_exactly(watched):
    """A ring of one page for 20000 hits made at once: hits are lost, and
    those printed plus those said lost are all that perf counts of the
    same workload with its own breakpoint."""
    n = 20_000
    work = f"echo 'watch_write {n}' > {STRESS}"
    res = ksym(f"{VAR}:-w-", "--buffer-size-kb", "4", "--", "sh", "-c", work)
    assert res.returncode == 0, res.stderr
    m = re.search(r"^mmiotrace-ng: (\d+) hits printed \(.* (\d+) counted\), lost (\d+)$",
                  res.stderr, re.M)
    assert m, res.stderr
    printed, counted, lost = map(int, m.groups())
    # the stream says each loss where it happened: "# lost N hits"
    marks = [int(x) for x in re.findall(r"^# lost (\d+) hits$", res.stdout, re.M)]
    shown = "\n".join(ln for ln in res.stdout.splitlines() if not ln.startswith("# lost "))
    assert printed == len(hits(shown)) and lost > 0 and sum(marks) == lost, (printed, lost)
    assert printed + lost == counted == n == perf_count(f"mem:0x{watched:x}/4:w", work)


def test_values_and_timestamps(exerciser):
    res = ksym(f"{VAR}:-w-", "--value", "--timestamps", "--", "sh", "-c",
               f"echo 'watch_write 5' > {STRESS}")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "# TASK-PID CPU# TIMESTAMP Symbol Type Value Function"
    rows = [ln.split() for ln in lines[1:]]
    assert [r[6] for r in rows] == ["0x1", "0x2", "0x3", "0x4", "0x5"]   # i + 1
    stamps = [float(r[3]) for r in rows]
    assert stamps == sorted(stamps) and all(re.fullmatch(r"\d+\.\d{6}", r[3]) for r in rows)


@pytest.mark.parametrize(("args", "why"), [
    (["edu_watched:rw-"], "it is in edu_exerciser: MODULE:SYMBOL"),
    (["a:b:c:rw-"], "expected [MODULE:]SYMBOL"),
    (["panic_timeout"], "expected [MODULE:]SYMBOL"),
    (["panic_timeout:r--"], "no read-only data breakpoint"),
    (["panic_timeout:rwx"], "OP must be rw-"),
    (["no_such_symbol_at_all:rw-"], "no symbol no_such_symbol_at_all in the kernel"),
    (["panic_timeout:rw-", "panic_timeout/4:-w-"], "watched twice"),
    (["panic_timeout/3:rw-"], "LEN must be 1, 2, 4 or 8"),
    (["panic_timeout+2/4:rw-"], "must be 4-byte aligned"),
    (["schedule:rw-"], "is a function"),
    ([f"{VAR}:rw-", "panic_timeout:rw-", "max_threads:rw-", "edu_exerciser:edu_watch_sink:rw-",
      "jiffies_64:rw-"], "at most 4 at a time"),
])
def test_bad_request_one_line_exit_2(exerciser, args, why):
    res = ksym(*args, "--", "true")
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmiotrace-ng: ") and why in lines[0], lines


FOUR = [f"{VAR}:-w-", "edu_exerciser:edu_watch_sink:-w-", "panic_timeout:-w-", "max_threads:-w-"]


def test_sigkill_leaves_no_breakpoint(exerciser):
    """Four watches take every debug register; after SIGKILL a fresh run
    can take all four again and counts exactly."""
    proc = subprocess.Popen([*NG, "ksym", *FOUR], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    err = ""
    while "mmiotrace-ng: ready" not in err and time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, err
        err += line
    assert "mmiotrace-ng: ready" in err, err
    # a fifth breakpoint has no register left: perf is refused
    sink = address("edu_watch_sink", "edu_exerciser")
    busy = subprocess.run(["perf", "stat", "-a", "-e", f"mem:0x{sink:x}/4:w", "--", "true"],
                          capture_output=True, text=True)
    assert "<not counted>" in busy.stderr or busy.returncode != 0, busy.stderr
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert not Path(f"/proc/{proc.pid}").exists()
    res = ksym(*FOUR, "--", "sh", "-c", f"echo 'watch_write 10' > {STRESS}")
    assert res.returncode == 0, res.stderr
    assert len(hits(res.stdout)) == 10


def test_cpu_coming_online_is_watched(exerciser):
    if not CPU1.exists():
        pytest.fail("the guest has one CPU: boot it with two", pytrace=False)
    CPU1.write_text("0\n")
    try:
        proc = subprocess.Popen([*NG, "ksym", f"{VAR}:-w-"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        err = ""
        while "mmiotrace-ng: ready" not in err:
            line = proc.stderr.readline()
            assert line, err
            err += line
        CPU1.write_text("1\n")
        time.sleep(2)                      # the tracer looks every 0.5 s
        subprocess.run(["taskset", "-c", "1", "sh", "-c",
                        f"echo 'watch_write 50' > {STRESS}"], check=True)
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=60)
    finally:
        CPU1.write_text("1\n")
    assert proc.returncode == 0, err + rest
    rows = hits(out)
    assert len(rows) == 50 and {r[2] for r in rows} == {"1"}, out[:500]


def test_with_mmio_tracing_in_another_process(exerciser):
    """ksym and MMIO tracing at once, each exact."""
    t = NgTracer(["--pci", exerciser.dev.name], "ng-with-ksym").start()
    try:
        res = ksym(f"{VAR}:-w-", "--", "sh", "-c",
                   f"echo 'watch_write 100' > {STRESS}; echo readl > "
                   f"{EXERCISER_DEBUGFS / 'run'}")
        text = t.section(lambda: exerciser.run("readl"))
    finally:
        assert t.stop() == 0, t.stderr()
    assert res.returncode == 0, res.stderr
    assert len(hits(res.stdout)) == 100
    assert len([ln for ln in text.splitlines() if ln.startswith("R ")]) == 4, text


BPF_PROG_TYPE_KPROBE, BPF_FUNC_PROBE_READ_KERNEL = 2, 113
INSN = struct.Struct("<BBhi")   # code, dst | src << 4, off, imm


def reading_program(addr: int, reads: int) -> bytes:
    """BPF bytecode, written out here: `reads` times
    bpf_probe_read_kernel(fp - 8, 4, addr), then return 0."""
    lo, hi = (ctypes.c_int32(addr & 0xFFFFFFFF).value, ctypes.c_int32(addr >> 32).value)
    one = b"".join([INSN.pack(0xBF, 0xA1, 0, 0),        # r1 = r10
                    INSN.pack(0x07, 0x01, 0, -8),       # r1 += -8
                    INSN.pack(0xB7, 0x02, 0, 4),        # r2 = 4
                    INSN.pack(0x18, 0x03, 0, lo),       # r3 = addr (ld_imm64)
                    INSN.pack(0x00, 0x00, 0, hi),
                    INSN.pack(0x85, 0x00, 0, BPF_FUNC_PROBE_READ_KERNEL)])
    return one * reads + INSN.pack(0xB7, 0, 0, 0) + INSN.pack(0x95, 0, 0, 0)


@contextlib.contextmanager
def bpf_reads_on_entry(addr: int, reads: int, functions: list[str]):
    """Another BPF program, on kprobes at the functions' entries, that reads
    addr `reads` times at each call: from inside a BPF program, where the
    kernel runs no other (ksym's among them)."""
    prog = bpfsys.prog_load(BPF_PROG_TYPE_KPROBE, "ksym_test_read",
                            reading_program(addr, reads), "GPL", 0)
    fds: list[int] = []
    try:
        for f in functions:
            fds.append(bpfsys.attach_kprobe(f, prog))
        yield
    finally:
        for fd in [*fds, prog]:
            os.close(fd)


def test_hits_inside_another_bpf_program_are_said_not_seen(watched):
    """The watched variable read 3 times by another BPF program at each call
    of the writer and the reader: the hit lines are the workload's own, and
    the summary says the 6 others, which perf counts on the same workload
    with its own breakpoint."""
    with bpf_reads_on_entry(watched, 3, ["edu_watch_writer", "edu_watch_reader"]):
        res = ksym(f"{VAR}:rw-", "--", "sh", "-c", WORKLOAD)
        perf = perf_count(f"mem:0x{watched:x}/4:rw")
    assert res.returncode == 0, res.stderr
    assert functions(hits(res.stdout)) == {"edu_watch_writer [edu_exerciser]": WRITES,
                                           "edu_watch_reader [edu_exerciser]": READS}
    m = re.search(r"^mmiotrace-ng: (\d+) hits printed \(.* (\d+) counted\), lost 0, "
                  r"(\d+) not seen by the BPF program \(another BPF program was running\)$",
                  res.stderr, re.M)
    assert m, res.stderr
    printed, counted, unseen = map(int, m.groups())
    assert (printed, unseen) == (WRITES + READS, 6)
    assert counted == perf == WRITES + READS + 6
