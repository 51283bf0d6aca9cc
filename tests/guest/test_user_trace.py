"""Accesses from user space through a traced BAR's mapping are traced: edu's
BAR0 mapped through its sysfs resource0 file (no driver bound: a driver's
claim refuses such mappings) by tests/drivers/user_mmio, which prints each
access it made (pid, op, width, offset, value, the instruction's address).
The truth is that program's own output: the trace must hold exactly those
accesses, in order, with its pid and PC (--pid --pc), after a MAP of its
mapping at the address mmap gave it; a forked child's access gets a MAP
and records of its own.  After the tracer stops, the program's accesses
must take no page fault the kernel handles (getrusage in the program: an
entry left armed would take one) and read right."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import EDU_ID, _rmmod
from kernel_tracer import find_pci_device
from ng_tracer import NgTracer

PROGRAM = Path(__file__).resolve().parent.parent / "drivers" / "user_mmio" / "user_mmio"
EDU_IDENT = 0x010000ED
ACCESS = re.compile(r"^ACCESS (\d+) ([RW]) (\d) (0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+)$")
RW = re.compile(r"^([RW]) (\d) \d+\.\d{6} (\d+) (0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+) (\d+)$")
MAP = re.compile(r"^MAP \d+\.\d{6} (\d+) (0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+) 0x0 (\d+)$")
UNMAP = re.compile(r"^UNMAP \d+\.\d{6} (\d+) 0x0 (\d+)$")


# arming a process's entries needs PROT_NONE entries: NUMA balancing, which
# PREEMPT_RT kernels have not (there the mappings are said: test_user_maps.py)
NUMA_BALANCING = Path("/proc/sys/kernel/numa_balancing").exists()


@pytest.fixture
def edu() -> Iterator[Path]:
    """edu's sysfs directory, with no driver bound."""
    if not NUMA_BALANCING:      # the suites boot no such kernel; the fallback: test_session
        pytest.skip("no NUMA balancing (a PREEMPT_RT kernel): mappings are said, not traced")
    dev = find_pci_device(*EDU_ID)
    assert dev is not None, "boot the test VM with QEMU's edu device"
    assert PROGRAM.exists(), f"{PROGRAM} is built by tests/setup.sh"
    _rmmod("edu_exerciser")
    sysdev = Path("/sys/bus/pci/devices") / dev.name
    assert not (sysdev / "driver").exists(), "edu has a driver bound"
    yield sysdev


def bar0(sysdev: Path) -> int:
    return int((sysdev / "resource").read_text().split()[0], 16)


class Program:
    """user_mmio running on edu's resource0, holding the mapping at the end."""

    def __init__(self, sysdev: Path, *args: str, program: Path = PROGRAM) -> None:
        self.proc = subprocess.Popen([str(program), str(sysdev / "resource0"), *args, "hold"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        while not self.lines or self.lines[-1] != "HOLDING":
            line = self._line()
            self.lines.append(line)
        pid, addr = self.lines[0].split()[1:]
        assert self.lines[0].startswith("MAPPED ") and int(pid) == self.proc.pid
        self.addr = int(addr, 16)

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"user_mmio ended ({self.proc.wait(30)}): {self.lines}"
        return line.rstrip("\n")

    def accesses(self) -> list[tuple[int, str, int, int, int, int]]:
        return [(int(m[1]), m[2], int(m[3]), int(m[4], 16), int(m[5], 16), int(m[6], 16))
                for m in map(ACCESS.match, self.lines) if m]

    def finish(self) -> tuple[int, str]:
        """The page faults the kernel handled for 64 reads now, and whether
        they read the ident."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        _, n, what = self._line().split()
        assert self.proc.wait(30) == 0
        return int(n), what


def until(done: Callable[[], bool], ng: NgTracer, seconds: float = 60) -> None:
    """Wait for the tracer's output to show something (done)."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, ng.text()
        time.sleep(0.2)


def traced(text: str, base: int) -> tuple[dict[int, tuple[int, int, int, int]], list[tuple]]:
    """The MAP lines (map id: phys, virt, len, pid) and the R/W lines of the
    BAR (pid, op, width, offset, value, pc, map id)."""
    maps = {int(m[1]): (int(m[2], 16), int(m[3], 16), int(m[4], 16), int(m[5]))
            for m in map(MAP.match, text.splitlines()) if m}
    rws = [(int(m[7]), m[1], int(m[2]), int(m[4], 16) - base, int(m[5], 16), int(m[6], 16),
            int(m[3])) for m in map(RW.match, text.splitlines()) if m]
    return maps, rws


def test_a_process_accesses_are_traced_with_its_pid_and_pc_and_nothing_stays_armed(edu):
    base = bar0(edu)
    ng = NgTracer(["--pci", edu.name, "--pid", "--pc"], "user-trace").start()
    try:
        prog = Program(edu, "fork")
        ng.wait_for(f"{prog.accesses()[-1][5]:#x}")
    finally:
        assert ng.stop() == 0
    text = ng.text()
    faults, read = prog.finish()
    done = prog.accesses()
    parent = [a for a in done if a[0] == prog.proc.pid]
    children = [a for a in done if a[0] != prog.proc.pid]
    assert len(parent) == 11 and len(children) == 1, done
    assert parent[0][1:5] == ("R", 4, 0, EDU_IDENT)
    assert parent[2][1:5] == ("R", 4, 4, 0xEDCBA987)      # edu's liveness: ~0x12345678
    maps, rws = traced(text, base)
    # every access, in order, with its pid, op, width, offset, value and pc
    assert [r[:6] for r in rws] == done, (rws, done)
    # each process's accesses through a MAP of its own: the mapping's
    # address there, BAR0's first page, the process's pid
    for pid in (prog.proc.pid, children[0][0]):
        ids = {r[6] for r in rws if r[0] == pid}
        assert len(ids) == 1, (pid, rws)
        assert maps[ids.pop()] == (base, prog.addr, 0x1000, pid), maps
    # each MAP before the accesses through it
    lines = text.splitlines()
    for map_id in maps:
        first_rw = next(i for i, line in enumerate(lines)
                        if (m := RW.match(line)) and int(m[3]) == map_id)
        assert any((m := MAP.match(line)) and int(m[1]) == map_id
                   for line in lines[:first_rw]), lines[:first_rw + 1]
    # nothing left armed: the reads after the stop took no fault, and read right
    assert (faults, read) == (0, "ident")
    assert "NOT traced" not in ng.stderr()


def test_alu_instructions_on_the_bar_are_traced_and_leave_what_the_cpu_leaves(edu):
    """or, cmp, test, add into a register, and, inc and an 8-byte or on a
    BAR register: each traced as the read (and the write) the program
    expects, and each leaving the same register and flags as the same
    program's run without the tracer (the CPU's own work).  Then a lock or,
    not emulated (a read then a write is not atomic): the page is given
    up, said once, and the instruction runs as without the tracer."""
    base = bar0(edu)
    untraced = Program(edu, "alu")
    assert untraced.finish() == (0, "ident")
    ng = NgTracer(["--pci", edu.name, "--pid", "--pc"], "user-trace-alu").start()
    try:
        prog = Program(edu, "alu")
        ng.wait_for(f"{prog.accesses()[-1][5]:#x}")
    finally:
        assert ng.stop() == 0
    faults, read = prog.finish()
    done = prog.accesses()
    _, rws = traced(ng.text(), base)
    assert [r[:6] for r in rws] == done, (rws, done)
    alu = [line for line in prog.lines if line.startswith(("ALU ", "LOCKED "))]
    assert len(alu) == 8 and alu == [x for x in untraced.lines
                                     if x.startswith(("ALU ", "LOCKED "))], (alu, untraced.lines)
    # the program's last read of the register: what its last write left there
    assert done[-1][1:5] == ("R", 4, 0x80, done[-2][4]) and done[-2][1] == "W", done[-2:]
    assert alu[-1] == f"LOCKED {done[-1][4] | 0x100:#x}"
    assert (faults, read) == (0, "ident")
    said = (f"mmiotrace-ng: the page {base:#x} of process {prog.proc.pid}'s mapping at "
            f"{prog.addr:#x} is NOT traced from here on: an access to it the helper does "
            f"not emulate")
    assert ng.stderr().count("is NOT traced from here on") == 1 and said in ng.stderr(), (
        ng.stderr())


@pytest.fixture
def uio(edu: Path) -> Iterator[Path]:
    """edu bound to uio_pci_generic (a user-space driver's way: it claims no
    BAR, so the sysfs resource files map), unbound again after."""
    subprocess.run(["modprobe", "uio_pci_generic"], check=True)
    (edu / "driver_override").write_text("uio_pci_generic\n")
    try:
        Path("/sys/bus/pci/drivers_probe").write_text(edu.name + "\n")
        assert (edu / "driver").resolve().name == "uio_pci_generic"
        yield edu
    finally:
        if (edu / "driver").exists():
            (edu / "driver" / "unbind").write_text(edu.name + "\n")
        (edu / "driver_override").write_text("\n")


def test_a_process_driving_the_device_through_uio_pci_generic_is_traced(uio):
    """The device bound to uio_pci_generic, the program's accesses through
    resource0: traced exactly, with its pid and pc, nothing left armed."""
    base = bar0(uio)
    ng = NgTracer(["--pci", uio.name, "--pid", "--pc"], "user-trace-uio").start()
    try:
        prog = Program(uio)
        ng.wait_for(f"{prog.accesses()[-1][5]:#x}")
    finally:
        assert ng.stop() == 0
    _, rws = traced(ng.text(), base)
    assert [r[:6] for r in rws] == prog.accesses() and len(rws) == 11, rws
    assert prog.finish() == (0, "ident")
    assert "NOT traced" not in ng.stderr()


def test_an_or_through_a_read_only_mapping_faults_as_without_the_tracer(edu):
    """A read-modify-write through a read-only mapping: a SIGSEGV, traced or
    not, and the tracer made no access for it (its read neither: the
    program's one read before it is the only record)."""
    base = bar0(edu)
    argv = [str(PROGRAM), str(edu / "resource0"), "rdonly"]
    untraced = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert untraced.returncode == -signal.SIGSEGV and untraced.stdout.endswith("OR\n")
    ng = NgTracer(["--pci", edu.name, "--pid"], "user-trace-rdonly").start()
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        ng.wait_for(f"{base:#x} {EDU_IDENT:#x} ")
    finally:
        assert ng.stop() == 0
    assert run.returncode == -signal.SIGSEGV and run.stdout.endswith("OR\n"), run
    pid = int(run.stdout.split()[1])
    _, rws = traced(ng.text(), base)
    assert [r[:5] for r in rws] == [(pid, "R", 4, 0, EDU_IDENT)], rws
    # a CPU that faults such an or as a read (TCG does) hands it to the
    # helper, which gives the page up; one that faults it as a write does not
    given_up = ng.stderr().count("is NOT traced from here on")
    assert given_up <= 1 and (not given_up or f"of process {pid}'s mapping" in ng.stderr())


def test_a_mapping_held_before_the_start_is_traced_from_the_start(edu):
    base = bar0(edu)
    prog = Program(edu)
    ng = NgTracer(["--pci", edu.name, "--pid", "--pc"], "user-trace-before").start()
    try:
        faults, read = prog.finish()
        ng.wait_for(f"{base:#x} {EDU_IDENT:#x} ")
    finally:
        assert ng.stop() == 0
    # each read trapped and emulated, none handled by the kernel
    assert read == "ident" and faults == 0
    maps, rws = traced(ng.text(), base)
    reads = [r for r in rws if r[0] == prog.proc.pid]
    assert len(reads) == 64 and all(r[1:5] == ("R", 4, 0, EDU_IDENT) for r in reads), rws
    assert {r[6] for r in reads} == {min(maps)}
    assert maps[min(maps)] == (base, prog.addr, 0x1000, prog.proc.pid)


def test_a_mapping_s_unmap_comes_at_munmap_and_at_exit(edu):
    """The program unmaps the BAR, maps it again and reads there, then exits:
    an UNMAP of the first mapping (before the second's MAP) and one of the
    second at the exit, each with the program's pid."""
    base = bar0(edu)
    ng = NgTracer(["--pci", edu.name, "--pid"], "user-trace-unmap").start()
    try:
        prog = Program(edu, "remap")
        again = int(next(x for x in prog.lines if x.startswith("REMAPPED ")).split()[2], 16)
        assert prog.finish() == (0, "ident")        # and the program exits
        until(lambda: sum(map(bool, map(UNMAP.match, ng.text().splitlines()))) >= 2, ng)
    finally:
        assert ng.stop() == 0
    lines = ng.text().splitlines()
    maps, rws = traced(ng.text(), base)
    first, second = sorted(maps)
    assert (maps[first][1], maps[second][1]) == (prog.addr, again), maps
    unmaps = [(i, int(m[1]), int(m[2])) for i, m in enumerate(map(UNMAP.match, lines)) if m]
    assert [u[1:] for u in unmaps] == [(first, prog.proc.pid), (second, prog.proc.pid)]
    second_map = next(i for i, line in enumerate(lines)
                      if (m := MAP.match(line)) and int(m[1]) == second)
    last_rw = max(i for i, line in enumerate(lines) if RW.match(line))
    assert unmaps[0][0] < second_map and unmaps[1][0] > last_rw, lines
    # the 64 reads after the remap went through the second mapping
    assert sum(1 for r in rws if r[6] == second) == 65


def test_a_mapping_moved_by_mremap_is_traced_at_its_new_place(edu):
    """mremap moves the armed entries: the old place's UNMAP, then a MAP of
    the new place at the first read there, which is traced; nothing stays
    armed at either place once the tracer stops."""
    base = bar0(edu)
    ng = NgTracer(["--pci", edu.name, "--pid", "--pc"], "user-trace-mremap").start()
    try:
        prog = Program(edu, "mremap")
        moved = int(next(x for x in prog.lines if x.startswith("MOVED ")).split()[2], 16)
        ng.wait_for("UNMAP ")
        ng.wait_for(f"{base:#x} {EDU_IDENT:#x} ")
        until(lambda: len(traced(ng.text(), base)[1]) >= len(prog.accesses()), ng)
    finally:
        assert ng.stop() == 0
    assert prog.finish() == (0, "ident")        # at the new place: nothing armed
    lines = ng.text().splitlines()
    maps, rws = traced(ng.text(), base)
    assert [r[:6] for r in rws] == prog.accesses()
    first, second = sorted(maps)
    assert maps[first] == (base, prog.addr, 0x1000, prog.proc.pid), maps
    assert maps[second] == (base, moved, 0x1000, prog.proc.pid), maps
    assert rws[-1][6] == second and all(r[6] == first for r in rws[:-1]), rws
    unmaps = [(i, int(m[1])) for i, m in enumerate(map(UNMAP.match, lines)) if m]
    second_map = next(i for i, line in enumerate(lines)
                      if (m := MAP.match(line)) and int(m[1]) == second)
    assert [u[1] for u in unmaps] == [first] and unmaps[0][0] < second_map, lines
    assert "NOT traced" not in ng.stderr()


def test_a_process_killed_while_it_reads_leaves_nothing_behind(edu):
    """SIGKILL of a process in the middle of its traced reads on CPU 1: its
    mapping's UNMAP comes, the tracer goes on, and the next process's
    reads are traced and leave nothing armed."""
    base = bar0(edu)
    ng = NgTracer(["--pci", edu.name, "--pid"], "user-trace-killed").start()
    try:
        proc = subprocess.Popen(["taskset", "-c", "1", str(PROGRAM), str(edu / "resource0"),
                                 "loop", "0"], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        while proc.stdout.readline().rstrip("\n") != "LOOPING":
            assert proc.poll() is None
        ng.wait_for(f"{base:#x} {EDU_IDENT:#x} ")
        proc.kill()
        assert proc.wait(30) == -signal.SIGKILL
        ng.wait_for("UNMAP ")
        prog = Program(edu)
        faults, read = prog.finish()
        assert read == "ident" and faults == 0
        until(lambda: any(r[0] == prog.proc.pid for r in traced(ng.text(), base)[1]), ng)
    finally:
        assert ng.stop() == 0
    maps, rws = traced(ng.text(), base)
    killed = [r for r in rws if r[0] == proc.pid]
    loop = [r for r in killed if r[1:4] == ("R", 4, 0)]       # (and the first read)
    assert len(loop) > 1 and all(r[4] == EDU_IDENT for r in loop), killed
    assert len([r for r in rws if r[0] == prog.proc.pid]) == len(prog.accesses()) + 64, rws[-80:]
    assert "NOT traced" not in ng.stderr()
    after = Program(edu)
    assert after.finish() == (0, "ident")        # nothing left armed


def test_user_pid_traces_that_process_only(edu):
    """--user PID: of two processes holding the BAR before the start, the
    accesses of the one named are traced, the other's run untraced (and
    unsaid); both read right and neither is left armed."""
    base = bar0(edu)
    named, other = Program(edu), Program(edu)
    ng = NgTracer(["--pci", edu.name, "--pid", "--user", str(named.proc.pid)],
                  "user-trace-pid").start()
    try:
        assert named.finish() == (0, "ident") and other.finish() == (0, "ident")
        until(lambda: len(traced(ng.text(), base)[1]) >= 64, ng)
    finally:
        assert ng.stop() == 0
    maps, rws = traced(ng.text(), base)
    assert {m[3] for m in maps.values()} == {named.proc.pid}, maps
    assert len(rws) == 64 and {r[0] for r in rws} == {named.proc.pid}
    assert all(r[1:5] == ("R", 4, 0, EDU_IDENT) for r in rws)
    assert "NOT traced" not in ng.stderr()


def test_user_name_traces_the_processes_of_that_name_and_their_forks(edu, tmp_path):
    """--user NAME: a process of that name started after the start is
    traced whole, its fork's child too (it keeps the name); another
    program's process and its child are not."""
    base = bar0(edu)
    renamed = tmp_path / "user_mmio_named"          # 15 bytes: the whole comm
    shutil.copy(PROGRAM, renamed)
    ng = NgTracer(["--pci", edu.name, "--pid", "--user", renamed.name],
                  "user-trace-name").start()
    try:
        named = Program(edu, "fork", program=renamed)
        other = Program(edu, "fork")
        ng.wait_for(f"{base:#x} {EDU_IDENT:#x} ")
        until(lambda: len(traced(ng.text(), base)[1]) >= len(named.accesses()), ng)
    finally:
        assert ng.stop() == 0
    assert named.finish() == (0, "ident") and other.finish() == (0, "ident")
    _, rws = traced(ng.text(), base)
    assert [r[:5] for r in rws] == [a[:5] for a in named.accesses()], rws
    child = {a[0] for a in named.accesses()} - {named.proc.pid}
    assert len(child) == 1 and {r[0] for r in rws} == {named.proc.pid, *child}
    assert "NOT traced" not in ng.stderr()


def test_a_kernel_access_through_the_mapping_gives_its_page_up_and_says_so(edu):
    """A write() from the mapping into a pipe: the kernel's own copy faults
    on the armed page, which is given up (said) and works untraced."""
    base = bar0(edu)
    untraced = Program(edu, "syscall")
    assert untraced.finish() == (0, "ident")
    ng = NgTracer(["--pci", edu.name], "user-trace-kernel").start()
    try:
        prog = Program(edu, "syscall")
        line = (f"mmiotrace-ng: the page {base:#x} of process {prog.proc.pid}'s mapping at "
                f"{prog.addr:#x} is NOT traced from here on: an access to it from kernel mode")
        ng.wait_for(line)
        faults, read = prog.finish()
    finally:
        assert ng.stop() == 0
    # the kernel's copy (edu reads what a byte-wise copy reads) as untraced
    pipe = [line for line in prog.lines if line.startswith("PIPE ")]
    assert len(pipe) == 1 and pipe == [x for x in untraced.lines if x.startswith("PIPE ")]
    assert (faults, read) == (0, "ident")       # the page given up: no fault since
    assert line in ng.stderr()
    assert sum(line in t for t in ng.text().splitlines()) == 1


def test_tracers_come_and_go_while_a_process_reads_on_another_cpu(edu):
    """Arming at a start (ARM_USER), the process's faults on CPU 1 and the
    disarm at a stop or a SIGKILL of the tracer on CPU 0, over and over:
    every read the process made read the identification, each tracer
    traced some of them, and none is left armed."""
    base = bar0(edu)
    proc = subprocess.Popen(["taskset", "-c", "1", str(PROGRAM), str(edu / "resource0"),
                             "loop", "0", "hold"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        lines = [proc.stdout.readline().rstrip("\n")]
        assert lines[0].startswith("MAPPED ")
        while lines[-1] != "LOOPING":
            lines.append(proc.stdout.readline().rstrip("\n"))
            assert lines[-1], lines
        cycles = 0
        deadline = time.monotonic() + 15
        while cycles < 2 or time.monotonic() < deadline:
            ng = NgTracer(["--pci", edu.name, "--pid"], f"user-trace-race-{cycles}").start()
            try:
                ng.wait_for(f"{base:#x} {EDU_IDENT:#x} ")
            finally:
                status = ng.stop(signal.SIGKILL if cycles % 2 else signal.SIGINT)
            assert status in (0, -signal.SIGKILL)
            assert "NOT traced" not in ng.stderr()
            traced_reads = [m for m in map(RW.match, ng.text().splitlines())
                            if m and int(m[7]) == proc.pid]
            assert traced_reads and all(int(m[5], 16) == EDU_IDENT for m in traced_reads)
            cycles += 1
        proc.send_signal(signal.SIGUSR1)       # the loop ends
        while not lines[-1].startswith("HOLDING"):
            lines.append(proc.stdout.readline().rstrip("\n"))
            assert lines[-1], lines
        loop = next(line for line in lines if line.startswith("LOOP "))
        reads, wrong = map(int, loop.split()[1:])
        assert reads > 0 and wrong == 0, loop
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split()[1:] == ["0", "ident"]    # nothing left armed
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait(30)
