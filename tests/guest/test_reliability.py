"""Kills, unloads, races and hostile input: nothing stays armed, the kernel is unharmed.

SIGKILL cycles run twice: of mmiotrace-ng itself at its four kinds of points
(start-up, armed and idle, mid-burst, shutdown), and of a bare controller
process that arms the edu BAR over generic netlink as mmiotrace-ng does,
which can be killed within microseconds of arming.
"""

from __future__ import annotations

import errno
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import stress_length
from held import assert_left_whole, ensure_helper, held_pages, hold, wait_whole
from kernel_tracer import find_pci_device, to_records
from ng_tracer import NG, REPO, NgTracer, helper_status

import mmiotrace_ng.tracer.netlink as nl
from mmiotrace_ng.format.abi import MmiotngCmd, Mode
from mmiotrace_ng.tracer.vmalloc import read_vmallocinfo

PY = sys.executable  # the guest's Python: the venv, or a release's own (tests/vm/run)
# kill cycles per test: two at each of the CLI's four kinds of points (50 s
# of tests/run under TCG); NG_STRESS_SCALE multiplies them
KILL_CYCLES = round(stress_length(8))
E1000_ID = (0x8086, 0x100E)

def spawn_controller(start: int, length: int) -> tuple[int, int]:
    """A child process that arms the range as mmiotrace-ng does (the filter,
    then the held mapping made before it), then waits to be killed; forked,
    so it needs no interpreter start-up.  (pid, pipe fd): the pipe says
    "armed" once both are in place."""
    virt, pages, _present = held_pages()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            h = nl.HelperSocket()
            h.filter_add(start, length)
            if pages:
                h.arm_existing(virt, pages * 4096, start)
            os.write(w, b"armed\n")
            time.sleep(3600)
        finally:
            os._exit(1)
    os.close(w)
    return pid, r


def assert_disarmed() -> None:
    """Nothing armed: the held mapping's pages are all present (the page
    table says so, not only the helper), and the helper agrees."""
    wait_whole()
    st = helper_status()
    assert st["armed_pages"] == 0 and st["mappings"] == 0, st
    assert st["filters"] == 0 and st["owner"] == 0, st


class Workload:
    """The exerciser running scenarios in a loop in the background."""

    def __init__(self, exerciser, names=("readl", "writel", "toio", "burst 200")) -> None:
        self.ex = exerciser
        self.names = names
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.runs = 0
        self.th = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            for line in self.names:
                name, _, count = line.partition(" ")
                try:
                    self.ex.run(name, int(count) if count else None)
                except BaseException as exc:  # noqa: BLE001 (reported by finish)
                    self.errors.append(exc)
                    return
                self.runs += 1
                # a breath between runs, so that what is under test gets a CPU
                self.stop.wait(0.002)

    def __enter__(self) -> Workload:
        self.th.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.th.join(120)
        assert not self.th.is_alive(), "the exerciser hangs"
        assert not self.errors, self.errors
        assert self.ex.mismatches() == 0


def test_sigkill_controller_cycles(held):
    """SIGKILL of the controlling process at random points, while the driver
    works and a mapping of the device is held: after each kill every page of
    it is present again."""
    exerciser = held
    hold("map")
    start, length = exerciser.bar0
    rnd = random.Random(1234)
    with Workload(exerciser) as work:
        for i in range(KILL_CYCLES):
            pid, pipe = spawn_controller(start, length)
            try:
                if rnd.random() < 0.7:      # armed, the driver mapping and accessing
                    assert os.read(pipe, 16) == b"armed\n"
                    assert held_pages()[2] == 0, "the held mapping is not armed"
                    time.sleep(rnd.uniform(0, 0.3))
                else:                      # somewhere in start-up
                    time.sleep(rnd.uniform(0, 0.05))
            finally:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(pipe)
            assert_disarmed()
            print(f"cycle {i}: ok, {work.runs} scenario runs", flush=True)
        assert work.runs > KILL_CYCLES
    assert_left_whole(exerciser)


KILL_POINTS = ("start-up", "armed and idle", "mid-burst", "shutdown")


def wait_ready(proc: subprocess.Popen, errf: Path, timeout: float = 300.0) -> float:
    """Seconds until mmiotrace-ng printed its ready line."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if "mmiotrace-ng: ready" in errf.read_text(errors="replace"):
            return time.monotonic() - t0
        assert proc.poll() is None, errf.read_text(errors="replace")
        time.sleep(0.05)
    raise AssertionError("mmiotrace-ng never got ready: " + errf.read_text(errors="replace"))


def test_sigkill_cli_cycles(held, tmp_path):
    """SIGKILL of mmiotrace-ng itself at the four kinds of points, in turn, at
    random moments, while the driver keeps working: nothing stays armed (the
    held mapping's pages all present after each kill)."""
    exerciser = held
    hold("map")
    rnd = random.Random(4321)
    errf = tmp_path / "err"
    cmd = [*NG, "--pci", exerciser.dev.name, "-o", str(tmp_path / "out.txt")]
    counts = dict.fromkeys(KILL_POINTS, 0)
    ready_s = 5.0
    with Workload(exerciser) as work:
        for i in range(KILL_CYCLES):
            point = KILL_POINTS[i % len(KILL_POINTS)]
            burst = None
            with open(errf, "wb") as err:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            try:
                if point == "start-up":
                    time.sleep(rnd.uniform(0, ready_s))
                else:
                    ready_s = wait_ready(proc, errf)
                    assert held_pages()[2] == 0, "ready, but the held mapping is not armed"
                    if point == "armed and idle":
                        time.sleep(rnd.uniform(0, 0.5))
                    elif point == "mid-burst":
                        burst = threading.Thread(target=exerciser.run, args=("burst", 20_000))
                        burst.start()
                        time.sleep(rnd.uniform(0.05, 0.5))
                    else:
                        proc.send_signal(signal.SIGINT)
                        time.sleep(rnd.uniform(0, 0.3))
            finally:
                proc.kill()
                proc.wait(60)
            if burst is not None:
                burst.join(300)
                assert not burst.is_alive(), "the burst hangs after the kill"
            assert_disarmed()
            counts[point] += 1
            print(f"cycle {i} ({point}): nothing armed; ready took {ready_s:.1f} s, "
                  f"{work.runs} scenario runs so far", flush=True)
        assert work.runs > KILL_CYCLES
    assert_left_whole(exerciser)    # untraced and working, the helper unloads
    assert exerciser.mismatches() == 0
    leftovers = Path("/sys/kernel/tracing/kprobe_events").read_text()
    assert "mmiotrace" not in leftovers and "bcc_" not in leftovers, leftovers
    print("kills by point:", counts)


def test_filters_race_with_ioremap(held):
    """Adding and removing filters while the driver maps and unmaps on another
    CPU, and a mapping is held: it is whole at the end."""
    exerciser = held
    hold("map")
    start, length = exerciser.bar0
    with Workload(exerciser, names=("subpage", "unaligned", "readl")), nl.HelperSocket() as h:
        for _ in range(300):
            h.filter_add(start, length)
            time.sleep(0.002)
            h.filter_del(start, length)
        h.disarm_all()
    assert_disarmed()
    assert_left_whole(exerciser)


def raw_request(h: nl.HelperSocket, cmd: int, attrs: list) -> int:
    """Send a command with arbitrary attributes; 0 or the errno."""
    msg = nl.ngmsg()
    msg["cmd"] = cmd
    msg["version"] = 1
    msg["attrs"] = attrs
    try:
        h.sock.nlm_request(msg, msg_type=h.sock.prid,
                           msg_flags=nl.NLM_F_REQUEST | nl.NLM_F_ACK)
    except nl.NetlinkError as exc:
        return exc.code
    return 0


def test_hostile_netlink_input(held):
    exerciser = held
    hold("map")
    start, length = exerciser.bar0
    with nl.HelperSocket() as h:
        C = MmiotngCmd  # noqa: N806
        # each case has one right answer
        cases = [
            (C.MMIOTNG_CMD_FILTER_ADD, [], errno.EINVAL),                      # no attributes
            (C.MMIOTNG_CMD_FILTER_ADD, [["MMIOTNG_A_PHYS", start]], errno.EINVAL),  # no size
            (C.MMIOTNG_CMD_FILTER_ADD, [["MMIOTNG_A_PHYS", start], ["MMIOTNG_A_SIZE", 0]],
             errno.EINVAL),
            (C.MMIOTNG_CMD_FILTER_ADD, [["MMIOTNG_A_PHYS", start],
                                        ["MMIOTNG_A_SIZE", 2**64 - 4096]], errno.EINVAL),
            (C.MMIOTNG_CMD_FILTER_ADD, [["MMIOTNG_A_PHYS", start + length - 4],
                                        ["MMIOTNG_A_SIZE", 8]], errno.EINVAL),  # past the BAR
            (C.MMIOTNG_CMD_FILTER_ADD, [["MMIOTNG_A_PHYS", 0x100000],
                                        ["MMIOTNG_A_SIZE", 0x100000]], errno.EINVAL),  # RAM
            (C.MMIOTNG_CMD_ARM_EXISTING, [["MMIOTNG_A_VIRT", 0xFFFFFFFF81000000],
                                          ["MMIOTNG_A_SIZE", 4096],
                                          ["MMIOTNG_A_PHYS", start]], errno.EINVAL),  # text
            (C.MMIOTNG_CMD_ARM_EXISTING, [["MMIOTNG_A_VIRT", 0], ["MMIOTNG_A_SIZE", 4096],
                                          ["MMIOTNG_A_PHYS", start]], errno.EINVAL),
            (C.MMIOTNG_CMD_SET_MODE, [["MMIOTNG_A_MODE", 7]], errno.EINVAL),
            # the benchmarks' trap-only mode, without test_modes=1
            (C.MMIOTNG_CMD_SET_MODE, [["MMIOTNG_A_MODE", Mode.TRAP_ONLY]], errno.EPERM),
            (C.MMIOTNG_CMD_FILTER_DEL, [["MMIOTNG_A_PHYS", start], ["MMIOTNG_A_SIZE", 4096]],
             errno.ENOENT),
            (99, [], errno.EOPNOTSUPP),                                         # no such cmd
            # a reply-only attribute in a request (MMIOTNG_ATTRS: REPLY)
            (C.MMIOTNG_CMD_STATUS, [["MMIOTNG_A_STAT_FAULTS", 1]], errno.EINVAL),
        ]
        for cmd, attrs, want in cases:
            code = raw_request(h, cmd, attrs)
            assert code == want, (cmd, attrs, code)
        # overlapping filters
        h.filter_add(start, length)
        assert raw_request(h, C.MMIOTNG_CMD_FILTER_ADD, [["MMIOTNG_A_PHYS", start + 4096],
                                                          ["MMIOTNG_A_SIZE", 4096]]) == errno.EEXIST
        # a mapping that is not ioremapped from the filtered range: vmalloc memory
        info = read_vmallocinfo().splitlines()    # with real addresses
        vm = next(int(ln.split("-")[0], 16) for ln in info if "vmalloc" in ln and "pages=" in ln)
        assert raw_request(h, C.MMIOTNG_CMD_ARM_EXISTING,
                           [["MMIOTNG_A_VIRT", vm], ["MMIOTNG_A_SIZE", 4096],
                            ["MMIOTNG_A_PHYS", start]]) == errno.EINVAL   # maps RAM
        # the helper's own memory (its windows onto device pages): not a
        # mapping of the range, whatever PHYS says
        own = next(ln for ln in info if "[mmiotng]" in ln)
        assert raw_request(h, C.MMIOTNG_CMD_ARM_EXISTING,
                           [["MMIOTNG_A_VIRT", int(own.split("-")[0], 16)],
                            ["MMIOTNG_A_SIZE", 4096],
                            ["MMIOTNG_A_PHYS", start]]) == errno.EINVAL
        # a second controller is refused while this one owns the helper
        with nl.HelperSocket() as other, pytest.raises(nl.HelperError) as exc:
            other.filter_add(start, length)
        assert exc.value.errno == errno.EBUSY
        h.disarm_all()
    exerciser.run("readl")
    assert_disarmed()


def test_unprivileged_netlink_refused(held):
    exerciser = held
    hold("map")
    start, length = exerciser.bar0
    code = f"""
from mmiotrace_ng.tracer.netlink import HelperSocket, HelperError
try:
    HelperSocket().filter_add({start}, {length})
except HelperError as e:
    raise SystemExit(100 + e.errno)
"""
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "--inh-caps=-all", PY, "-c", code],
                         env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True)
    assert res.returncode == 100 + errno.EPERM, res.stderr
    assert_disarmed()


def test_sigterm_complete_and_mid_burst(held):
    """SIGTERM after a write loop: every write is traced or counted lost, exactly.
    SIGTERM during one: exit 0, the writes traced are in order, every gap in
    them counted lost in that phase, nothing armed."""
    exerciser = held
    hold("map")
    n = 200_000
    t = NgTracer(["--pci", exerciser.dev.name], "ng-sigterm").start()
    try:
        text = t.section(lambda: exerciser.run("wloop", n))
        recs = to_records(text, exerciser.bar0[0])
        writes = [r for r in recs if r[:3] == ("W", 4, 0x04)]
        maps = sum(r[0] in ("MAP", "UNMAP") for r in recs)
        lost = sum(r[1] for r in recs if r[0] == "LOST")
        assert len(writes) + maps + lost == n + 2, (len(writes), maps, lost)
        assert [w[3] for w in writes] == sorted({w[3] for w in writes})

        th = threading.Thread(target=exerciser.run, args=("wloop", 50 * n))
        th.start()
        time.sleep(1.0)
        assert th.is_alive(), "the loop ended before the signal: make it longer"
    finally:
        assert t.stop(signal.SIGTERM) == 0
    th.join(600)
    tail = t.text().split(f"ng-section-end-{t.seq}", 1)[1]
    values = [r[3] for r in to_records(tail, exerciser.bar0[0]) if r[:3] == ("W", 4, 0x04)]
    assert values and values == sorted(set(values)), "writes out of order or repeated"
    # the losses of the run's second phase: the whole run's less the first's
    phase_lost = int(re.search(r"lost (\d+)", t.stderr()).group(1)) - lost
    assert values[-1] + 1 - len(values) <= phase_lost, "a gap that was not counted lost"
    assert_disarmed()
    assert_left_whole(exerciser)


def test_two_devices_unload_and_unplug(held):
    """edu and e1000 at once; rmmod of the traced driver; sysfs remove; helper rmmod."""
    exerciser = held
    hold("map")
    e1000 = find_pci_device(*E1000_ID)
    assert e1000 is not None
    subprocess.run(["rmmod", "e1000"], capture_output=True)
    t = NgTracer(["--pci", exerciser.dev.name, "--pci", e1000.name], "ng-two").start()
    try:
        subprocess.run(["modprobe", "e1000"], check=True)
        exerciser.run("readl")
        t.wait_for("R 4 ")
        # the held mapping of edu's BAR0, and e1000's BAR0 that stays mapped
        assert helper_status()["mappings"] >= 2
        subprocess.run(["rmmod", "e1000"], check=True)     # UNMAP of the traced mapping
        assert helper_status()["mappings"] == 1
        subprocess.run(["modprobe", "e1000"], check=True)
        Path(f"/sys/bus/pci/devices/{e1000.name}/remove").write_text("1")
        assert helper_status()["mappings"] == 1
        Path("/sys/bus/pci/rescan").write_text("1")
        subprocess.run(["rmmod", "e1000"], check=True)
        # under a running tracer the helper stays: its tracepoints hold BPF programs
        res = subprocess.run(["rmmod", "mmiotng"], capture_output=True, text=True)
        assert res.returncode != 0 and "in use" in res.stderr, res
        assert Path("/sys/module/mmiotng").exists()
        exerciser.run("readl")
    finally:
        t.stop()
        subprocess.run(["rmmod", "e1000"], capture_output=True)
        ensure_helper()
        Path("/sys/bus/pci/rescan").write_text("1")
    text = t.text()
    maps = [ln for ln in text.splitlines() if ln.startswith("MAP ")]
    assert any(f"{exerciser.bar0[0]:#x}" in ln for ln in maps)
    assert any(f"{e1000.bars[0][0]:#x}" in ln for ln in maps)
    ids = [ln.split()[2] for ln in maps]
    assert ids == [str(i) for i in range(1, len(ids) + 1)]
    unmaps = [ln.split()[2] for ln in text.splitlines() if ln.startswith("UNMAP ")]
    held_virt = f"{held_pages()[0]:#x}"         # mapped all along: no UNMAP
    gone = [ln.split()[2] for ln in maps if ln.split()[4] != held_virt]
    assert len(gone) == len(ids) - 1, maps
    assert set(gone) <= set(unmaps), "every traced mapping must have its UNMAP"
    assert_disarmed()
    assert_left_whole(exerciser)
