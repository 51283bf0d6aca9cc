"""The helper's crash races and unsafe fallbacks (issue 12, items 1-5 and 8).

Each test drives an exerciser stress scenario (the "stress" debugfs file)
in a child process, so that it can be bounded in time (SIGKILL ends the
scenario's loop with EINTR), while the test talks to the helper over
generic netlink the way mmiotrace-ng does.  A kernel oops fails the test
through the autouse dmesg_clean fixture; the scenario's own value checks
(the "errors" file, EIO) show accesses that went wrong without an oops.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import EXERCISER_DEBUGFS, stress_length
from held import arm_held, assert_left_whole, ensure_helper, held_pages, hold, rmmod_helper
from kernel_tracer import find_pci_device, to_records
from ng_tracer import MARKER, REPO, NgTracer, helper_status
from test_reliability import PY

import mmiotrace_ng.tracer.netlink as nl
from mmiotrace_ng.tracer.vmalloc import read_vmallocinfo

STRESS = EXERCISER_DEBUGFS / "stress"
HELPER_KO = REPO / "kmod" / "mmiotng.ko"
IDENT = 0x010000ED
PAGE = 4096
HPET = 0xFED00000
FOREVER = 100_000_000          # a COUNT that outlasts any test: stopped by SIGKILL
# a PREEMPT_RT kernel: the RT patches' sysfs file, or (mainline RT, 6.12 on,
# which has no such file) the kernel's version string
REALTIME = Path("/sys/kernel/realtime").exists() or "PREEMPT_RT" in os.uname().version
# each race loop on two CPUs: over ten thousand rounds under TCG (15 s keeps
# the suite within 20 minutes; NG_STRESS_SCALE=10 is the soak)
RACE_SECONDS = stress_length(15.0)


def dbg(name: str) -> int:
    return int((EXERCISER_DEBUGFS / name).read_text().split()[0], 0)


def stress(line: str) -> None:
    """Run one stress scenario to its end, here (OSError with its errno)."""
    fd = os.open(STRESS, os.O_WRONLY)
    try:
        assert os.write(fd, (line + "\n").encode()) == len(line) + 1
    finally:
        os.close(fd)


class StressRun:
    """A stress scenario running in a child process until stop()."""

    def __init__(self, line: str) -> None:
        self.line = line
        self.proc = subprocess.Popen(
            ["sh", "-c", f'echo "{line}" > {STRESS}'],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise AssertionError(f"{self.line!r} ended early (status {self.proc.returncode}): "
                                 f"{self.proc.stderr.read().decode(errors='replace').strip()}; "
                                 f"{dbg('errors')} wrong values")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGKILL (the loop stops with EINTR); the scenario must have been
        running without a wrong value until then."""
        self.check_alive()
        self.proc.send_signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.line!r} does not stop (hangs in the kernel)") from None
        assert dbg("errors") == 0, f"{self.line!r}: {dbg('errors')} wrong values read"

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass


def wait_virt(name: str, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = dbg(name)
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError(f"{name} stayed 0")


def status() -> nl.Status:
    with nl.HelperSocket() as h:
        return h.status()


def test_stress_file_lists_the_new_scenarios(exerciser):
    names = [ln.split()[0] for ln in STRESS.read_text().splitlines() if ln.strip()]
    assert names == ["stride", "maploop", "maploop2", "kprobe_read", "window16", "straddle",
                     "wc_loop", "watch_write", "watch_read", "pagecross", "nmi",
                     "crossirq", "movs_cross", "nonpci", "pc", "fact", "irq_intx", "irq_msi",
                     "dma"]
    assert not set(names) & set(exerciser.scenarios())
    stress("stride 3")
    stress("maploop 100")


STRIDE_CYCLES_MIN = 200
STRIDE_SECONDS_MAX = 180


def test_arm_live_mapping_while_striding(held):
    """Item 1: ARM_EXISTING of a 1 MiB mapping another CPU strides through,
    armed and disarmed thousands of times: no oops, no wrong value.  A held
    mapping is armed and disarmed with it: every page of it is present
    after each delete (the page table, not the helper's word)."""
    exerciser = held
    hold("map")
    start, length = exerciser.bar0
    # the striding CPU walks the page tables again every round, as after a
    # context switch: a page cleared before its mapping is listed faults
    (EXERCISER_DEBUGFS / "stride_flush").write_text("1\n")
    run = StressRun(f"stride {FOREVER}")
    cycles = 0
    try:
        virt = wait_virt("stride_virt")
        # RACE_SECONDS, or longer until STRIDE_CYCLES_MIN cycles are made
        # (a busy host slows the guest), at most STRIDE_SECONDS_MAX
        t0 = time.monotonic()
        with nl.HelperSocket() as h:
            while cycles < 5000 and (
                    time.monotonic() < t0 + RACE_SECONDS
                    or cycles < STRIDE_CYCLES_MIN and time.monotonic() < t0 + STRIDE_SECONDS_MAX):
                h.filter_add(start, length)
                h.arm_existing(virt, length, start)
                if cycles % 16 == 0:
                    arm_held(h, start)
                h.filter_del(start, length)
                st = h.status()
                assert st.armed_pages == 0 and st.mappings == 0, (cycles, st)
                _virt, pages, present = held_pages()
                assert present == pages, f"after filter_del #{cycles}: {present} of {pages}"
                cycles += 1
                if cycles % 64 == 0:
                    run.check_alive()
            h.disarm_all()
        print(f"{cycles} arm/disarm cycles of the live mapping")
        run.stop()
    finally:
        run.kill()
        (EXERCISER_DEBUGFS / "stride_flush").write_text("0\n")
    assert cycles >= STRIDE_CYCLES_MIN
    assert_left_whole(exerciser)


def _filter_cycles(exerciser, run: StressRun, seconds: float) -> int:
    """Add and delete BAR0's filter for seconds beside the running maploop,
    the held mapping armed under every other one; after every delete
    nothing is armed, and every page of the held mapping is present.  The
    number of cycles."""
    start, length = exerciser.bar0
    rnd = random.Random(12)
    cycles = 0
    deadline = time.monotonic() + seconds
    with nl.HelperSocket() as h:
        while time.monotonic() < deadline:
            h.filter_add(start, length)
            if cycles % 2 == 0:
                arm_held(h, start)
            time.sleep(rnd.uniform(0, 0.004))
            h.filter_del(start, length)
            st = h.status()
            assert st.armed_pages == 0 and st.mappings == 0, f"after filter_del #{cycles}: {st}"
            _virt, pages, present = held_pages()
            assert present == pages, f"after filter_del #{cycles}: {present} of {pages}"
            cycles += 1
            if cycles % 32 == 0:
                run.check_alive()
        h.disarm_all()
    return cycles


def test_filter_del_racing_ioremap(held):
    """Item 2: filters come and go while the driver maps, holds and unmaps a
    page in a loop; after every delete nothing is armed and the driver
    reads the right values.  (No code is patched: multi-threaded TCG.)"""
    exerciser = held
    hold("map")
    (EXERCISER_DEBUGFS / "maploop_hold_us").write_text("20000\n")
    run = StressRun(f"maploop {FOREVER}")
    try:
        wait_virt("maploop_virt")
        cycles = _filter_cycles(exerciser, run, RACE_SECONDS)
        print(f"{cycles} filter add/del cycles")
        assert cycles >= 100
        run.stop()
    finally:
        run.kill()
        (EXERCISER_DEBUGFS / "maploop_hold_us").write_text("0\n")
    assert_left_whole(exerciser)


@pytest.mark.single_tcg
def test_rmmod_under_a_running_maploop(held):
    """Item 2, the unload: after filters came and went beside the loop, the
    helper is unloaded (no controller) while the driver maps, holds and
    unmaps a page in a loop: the unload happens, and the driver keeps
    working."""
    exerciser = held
    hold("map")
    (EXERCISER_DEBUGFS / "maploop_hold_us").write_text("20000\n")
    run = StressRun(f"maploop {FOREVER}")
    try:
        wait_virt("maploop_virt")
        _filter_cycles(exerciser, run, 5)
        res = subprocess.run(["rmmod", "mmiotng"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert not Path("/sys/module/mmiotng").exists()
        time.sleep(2)
        run.stop()
    finally:
        run.kill()
        (EXERCISER_DEBUGFS / "maploop_hold_us").write_text("0\n")
        ensure_helper()
    assert_left_whole(exerciser)


def test_another_filter_coming_and_going_beside_a_traced_loop(exerciser):
    """Item 9: a second filter (BAR0's last page) is added and deleted over
    and over while the driver maps page 0, under a filter of its own, reads
    it through an emulated access and unmaps it in a loop on the other
    CPU.  Deleting the second filter must leave the emulating CPU's window
    alone: every value the loop reads is right.  The helper sleeps 2 ms
    before it would reset the windows (test_reset_delay_ms: as a preemption
    there would) and holds each window 200 us before the access through it
    (test_window_hold_us), so that a change of the window shows."""
    subprocess.run(["rmmod", "mmiotng"], capture_output=True)
    subprocess.run(["insmod", str(HELPER_KO), "test_window_hold_us=200",
                    "test_reset_delay_ms=2"], check=True)
    start, length = exerciser.bar0
    other = start + length - PAGE
    run = StressRun(f"maploop {FOREVER}")
    cycles = 0
    try:
        wait_virt("maploop_virt")
        deadline = time.monotonic() + RACE_SECONDS
        with nl.HelperSocket() as h:
            h.filter_add(start, PAGE)
            while time.monotonic() < deadline:
                h.filter_add(other, PAGE)
                h.filter_del(other, PAGE)
                cycles += 1
                if cycles % 32 == 0:
                    run.check_alive()
            faults = h.status().faults
            h.disarm_all()
        print(f"{cycles} add/del cycles of the other filter, {faults} faults taken")
        assert faults > cycles, "the loop's reads were not trapped"
        run.stop()
    finally:
        run.kill()
        subprocess.run(["rmmod", "mmiotng"], check=True)
        ensure_helper()


@pytest.mark.single_tcg
def test_rmmod_with_session_racing_ioremap(held):
    """Item 2, at module exit: the helper is unloaded while a controller
    traces the BAR (a held mapping of it armed) and the driver maps and
    unmaps it in a loop.  Refused, or unloaded with every page of the held
    mapping present again: the driver keeps working, no oops."""
    exerciser = held
    hold("map")
    start, length = exerciser.bar0
    (EXERCISER_DEBUGFS / "maploop_hold_us").write_text("20000\n")
    run = StressRun(f"maploop {FOREVER}")
    unloaded = 0
    try:
        wait_virt("maploop_virt")
        for _ in range(4):
            ensure_helper()
            with nl.HelperSocket() as h:
                h.filter_add(start, length)
                arm_held(h, start)
                time.sleep(0.5)
                res = subprocess.run(["rmmod", "mmiotng"], capture_output=True, text=True,
                                     timeout=120)
                if res.returncode == 0:
                    assert not Path("/sys/module/mmiotng").exists()
                    _virt, pages, present = held_pages()
                    assert present == pages, f"unloaded, {pages - present} pages not present"
                    unloaded += 1
                time.sleep(1.0)          # the loop maps and reads on, untraced
                run.check_alive()
        run.stop()
    finally:
        run.kill()
        (EXERCISER_DEBUGFS / "maploop_hold_us").write_text("0\n")
        ensure_helper()
    print(f"helper unloaded under a session {unloaded} of 4 times")
    assert unloaded >= 1, "rmmod was refused every time: no unload was tested"
    assert_left_whole(exerciser)


def test_arm_existing_racing_iounmap(held):
    """Item 3: ARM_EXISTING of a mapping being unmapped, over and over; then
    the freed addresses are reused by new mappings (a stale entry written
    back would trip vmap's BUG_ON(!pte_none)).  The ioremap probe arms
    every mapping made while the filter is there, so the filter is added
    anew each round, after the mapping of the moment was read (the loop
    holds each for 20 ms): made before the filter, unarmed, ARM_EXISTING
    arms it as its iounmap comes or goes; the filter's delete then restores
    what was armed.  A held mapping armed beside it every round is whole
    at the end."""
    exerciser = held
    hold("map")
    start, length = exerciser.bar0
    (EXERCISER_DEBUGFS / "maploop_hold_us").write_text("20000\n")
    run = StressRun(f"maploop {FOREVER}")
    codes: dict[int, int] = {}
    try:
        wait_virt("maploop_virt")
        deadline = time.monotonic() + RACE_SECONDS
        with nl.HelperSocket() as h:
            n = 0
            while time.monotonic() < deadline:
                virt = dbg("maploop_virt")      # made before the filter: unarmed
                h.filter_add(start, length)
                if virt:
                    try:
                        h.arm_existing(virt, PAGE, start)
                        code = 0
                    except nl.HelperError as exc:
                        code = exc.errno
                    codes[code] = codes.get(code, 0) + 1
                if n % 10 == 0:
                    arm_held(h, start)
                h.filter_del(start, length)
                n += 1
                if n % 50 == 0:
                    st = h.status()
                    assert st.armed_pages == 0 and st.mappings == 0, st
                    run.check_alive()
            h.disarm_all()
        print("ARM_EXISTING results by errno:",
              {errno.errorcode.get(k, k): v for k, v in sorted(codes.items())})
        run.stop()
    finally:
        run.kill()
        (EXERCISER_DEBUGFS / "maploop_hold_us").write_text("0\n")
    # reuse the freed virtual addresses (the lazy vmap purge runs every
    # ~8k unmaps of this size)
    stress("maploop 40000")
    assert helper_status()["armed_pages"] == 0
    assert sum(codes.values()) > 100 and codes.get(0, 0) > 0, codes
    assert_left_whole(exerciser)


CAP_NET_ADMIN_ONLY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                      "--inh-caps=-all,+net_admin", "--ambient-caps=-all,+net_admin",
                      "--bounding-set=-all,+net_admin"]


def nl_errno(fn) -> int:
    try:
        fn()
    except nl.HelperError as exc:
        return exc.errno
    return 0


def iomem_busy(lo: int, hi: int) -> list[str]:
    """/proc/iomem entries other than bus windows that overlap [lo, hi)."""
    out = []
    for line in Path("/proc/iomem").read_text().splitlines():
        rng, _, name = line.strip().partition(" : ")
        a, b = (int(x, 16) for x in rng.split("-"))
        if a < hi and lo <= b and not name.startswith("PCI Bus"):
            out.append(line.strip())
    return out


def test_privilege_and_armable_ranges(exerciser):
    """Item 4: CAP_NET_ADMIN alone is not enough; only PCI memory BARs may be
    filtered; ARM_EXISTING with a PHYS the area does not map is refused."""
    ensure_helper()
    start, length = exerciser.bar0
    code = f"""
import os
caps = [ln for ln in open("/proc/self/status") if ln.startswith("CapEff")]
assert int(caps[0].split()[1], 16) == 1 << 12, caps      # CAP_NET_ADMIN only
from mmiotrace_ng.tracer.netlink import HelperSocket, HelperError
try:
    HelperSocket().filter_add({start}, {length})
except HelperError as e:
    raise SystemExit(100 + e.errno)
raise SystemExit(99)
"""
    res = subprocess.run([*CAP_NET_ADMIN_ONLY, PY, "-c", code],
                         env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True)
    got = {99: 0}.get(res.returncode, res.returncode - 100)      # 99: accepted
    assert got >= 0, res.stderr.decode()[-600:]
    results = {"(a) CAP_NET_ADMIN only: FILTER_ADD": (got, errno.EPERM, "")}
    assert helper_status()["filters"] == 0

    beyond = start + length
    with nl.HelperSocket() as h:
        results["(b) FILTER_ADD page 0"] = (nl_errno(lambda: h.filter_add(0, PAGE)),
                                            errno.EINVAL, "")
        h.disarm_all()
        results["(c) FILTER_ADD HPET page"] = (nl_errno(lambda: h.filter_add(HPET, PAGE)),
                                               errno.EINVAL, "")
        h.disarm_all()
        busy = iomem_busy(beyond, beyond + length)
        if not busy:
            results["(c) FILTER_ADD of the BAR-sized range after BAR0"] = (
                nl_errno(lambda: h.filter_add(beyond, length)), errno.EINVAL, "")
            h.disarm_all()
        else:
            # another device's BARs follow: the first free page of the
            # PCI window after BAR0 instead
            gap = beyond
            while iomem_busy(gap, gap + PAGE) and gap < 0xFEC00000:
                gap += PAGE
            assert gap < 0xFEC00000, busy
            print(f"range after BAR0 is in use ({busy[0]}...); free page {gap:#x} instead")
            results[f"(c) FILTER_ADD of the unused PCI page {gap:#x}"] = (
                nl_errno(lambda: h.filter_add(gap, PAGE)), errno.EINVAL, "")
            h.disarm_all()

    run = StressRun(f"stride {FOREVER}")
    try:
        virt = wait_virt("stride_virt")
        with nl.HelperSocket() as h:
            h.filter_add(start, length)
            # page-offset-consistent, inside the filter, but not what it maps
            results["(d) ARM_EXISTING, PHYS one page off"] = (
                nl_errno(lambda: h.arm_existing(virt, length - PAGE, start + PAGE)),
                errno.EINVAL, "")
            results["(d) ARM_EXISTING, VIRT one page off"] = (
                nl_errno(lambda: h.arm_existing(virt + PAGE, PAGE, start)), errno.EINVAL, "")
            # consistent, but only a part of the 1 MiB area: iounmap() of the
            # area would not find it
            results["(f) ARM_EXISTING of the area's second page"] = (
                nl_errno(lambda: h.arm_existing(virt + PAGE, PAGE, start + PAGE)),
                errno.EINVAL, "")
            results["(f) ARM_EXISTING of the area's first page"] = (
                nl_errno(lambda: h.arm_existing(virt, PAGE, start)), errno.EINVAL, "")
            results["(f) ARM_EXISTING of the area less its first page"] = (
                nl_errno(lambda: h.arm_existing(virt + PAGE, length - PAGE, start + PAGE)),
                errno.EINVAL, "")
            assert h.status().armed_pages == 0
            h.disarm_all()
        run.stop()
    finally:
        run.kill()
    # the helper's own windows, while one shows page 0 of BAR0 (the readl
    # was emulated through it): an armed window would fault on itself
    areas = [ln.split()[0] for ln in read_vmallocinfo().splitlines() if "ng_windows_init" in ln]
    assert len(areas) == 1, areas
    lo, hi = (int(x, 16) for x in areas[0].split("-"))
    with nl.HelperSocket() as h:
        h.filter_add(start, length)
        exerciser.run("readl")
        took = {va: nl_errno(lambda va=va: h.arm_existing(va, PAGE, start))
                for va in range(lo, hi - PAGE, PAGE)}     # the last page is a guard
        h.disarm_all()
    wrong = [c for c in took.values() if c != errno.EINVAL]
    results["(e) ARM_EXISTING of the helper's windows"] = (
        wrong[0] if wrong else errno.EINVAL, errno.EINVAL, "")
    def name(code: int) -> str:
        return "accepted" if code == 0 else errno.errorcode.get(code, str(code))

    bad = {k: (name(got), name(want)) for k, (got, want, _) in results.items() if got != want}
    print({k: name(v[0]) for k, v in results.items()})
    assert not bad, "got, wanted: " + repr(bad)


def test_iounmap_by_an_address_inside_an_armed_mapping_disarms_it(held):
    """Item 5: iounmap() of the held mapping's second page (a driver's bug)
    frees the whole area: the helper must disarm the mapping then, not
    keep it listed over freed address space (where a later ioremap would
    be silently untraced, and the session's end would find its entries
    gone), and nothing may be written into the freed range."""
    from held import held_pages, hold

    hold("map")
    stale = helper_status().get("stale", 0)
    t = NgTracer(["--pci", held.dev.name], "ng-unmap-inner").start()
    try:
        virt, pages, present = held_pages()
        assert present == 0, "the held mapping is not armed"
        hold("unmap_inner")
        st = helper_status()
    finally:
        assert t.stop() == 0, t.stderr()
    assert (st["mappings"], st["armed_pages"]) == (0, 0), st
    last = (EXERCISER_DEBUGFS / "held_last").read_text().split()
    assert (int(last[1], 16), last[5]) == (virt, "0"), last
    assert helper_status()["stale"] == stale, "entries found changed at the end"


def test_mmio_read_from_a_kprobe_handler_is_traced(exerciser):
    """Item 5: a BAR read made from inside another kprobe's handler is traced."""
    ensure_helper()
    t = NgTracer(["--pci", exerciser.dev.name], "ng-kprobe").start()
    try:
        text = t.section(lambda: stress("kprobe_read"))
    finally:
        assert t.stop() == 0
    recs = to_records(text, exerciser.bar0[0])
    assert ("R", 4, 0x00, IDENT) in recs, text


def pagecross_values() -> tuple[int, int]:
    """Run the pagecross scenario; the (readl, readq) values it logged."""
    mark = f"ng-pagecross-{time.monotonic_ns()}"
    Path("/dev/kmsg").write_text(mark + "\n")
    stress("pagecross")
    log = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    m = re.findall(r"pagecross: readl 0x([0-9a-f]+) readq 0x([0-9a-f]+)",
                   log[log.rindex(mark):])
    assert len(m) == 1, log[log.rindex(mark):]
    return int(m[0][0], 16), int(m[0][1], 16)


@pytest.mark.parametrize("mode", ["emulate", "singlestep"])
def test_movs_to_a_destination_across_a_page_reads_the_device_once(exerciser, mode):
    """Item 9: a movsl from the BAR to an armed destination that crosses a
    page reads its element from the device once.  Emulated, through the
    two-page window: the read, then the write.  Under --singlestep (two
    traced operands: stepped with the pages present): one record, the
    step's UNKNOWN (f3 a5), and no read by an emulation before it."""
    ensure_helper()
    args = ["--singlestep"] if mode == "singlestep" else []
    t = NgTracer(["--pci", exerciser.dev.name, *args], f"ng-movs-cross-{mode}").start()
    try:
        text = t.section(lambda: stress("movs_cross"))
    finally:
        assert t.stop() == 0
    recs = [r for r in to_records(text, exerciser.bar0[0]) if r[0] in ("R", "W", "UNKNOWN")]
    if mode == "emulate":
        assert recs == [("R", 4, 0x00, IDENT), ("W", 4, 0xFFE, IDENT)], text
    else:
        assert len(recs) == 1 and recs[0][:2] == ("UNKNOWN", 0x00), text
        assert recs[0][2][:2] == (0xF3, 0xA5), text


E1000_ID = (0x8086, 0x100E)
E1000_ICR, E1000_ICS, E1000_RDBAL = 0x00C0, 0x00C8, 0x2800
E1000_CAUSE = 0x80              # RXT0: set through ICS, read (and cleared) from ICR
PCI_DRIVERS = Path("/sys/bus/pci/drivers")


@pytest.fixture
def e1000_on_the_exerciser(exerciser):
    """The test VM's e1000 NIC bound to the exerciser (driver_override),
    which then maps its BAR 0 on request ("movs"); given back afterwards."""
    dev = find_pci_device(*E1000_ID)
    assert dev is not None, "boot the test VM with QEMU's e1000 (tests/run)"
    subprocess.run(["rmmod", "e1000"], capture_output=True)
    sysdev = Path("/sys/bus/pci/devices") / dev.name
    (sysdev / "driver_override").write_text("edu_exerciser\n")
    try:
        (PCI_DRIVERS / "edu_exerciser" / "bind").write_text(dev.name)
        try:
            yield dev
        finally:
            (PCI_DRIVERS / "edu_exerciser" / "unbind").write_text(dev.name)
    finally:
        (sysdev / "driver_override").write_text("\n")


def movs_from_icr(dev) -> int:
    """Set a cause in e1000's ICR (a register that clears when read) from
    user space, have the exerciser copy ICR to RDBAL with one movsl, and
    return what RDBAL got: the cause if ICR was read once, 0 if twice."""
    movs = Path("/sys/kernel/debug") / f"edu_exerciser-{dev.name}" / "movs"
    with open(Path("/sys/bus/pci/devices") / dev.name / "resource0", "r+b") as f, \
            mmap.mmap(f.fileno(), 0x4000) as bar:
        icr = ctypes.c_uint32.from_buffer(bar, E1000_ICR)
        ics = ctypes.c_uint32.from_buffer(bar, E1000_ICS)
        rdbal = ctypes.c_uint32.from_buffer(bar, E1000_RDBAL)
        try:
            rdbal.value = 0
            _ = icr.value                       # clears whatever was there
            ics.value = E1000_CAUSE
            movs.write_text(f"0 {E1000_ICR:#x} {E1000_RDBAL:#x}\n")
            return rdbal.value
        finally:
            del icr, ics, rdbal                 # the mmap closes only without them


@pytest.mark.parametrize("mode", ["emulate", "singlestep"])
def test_movs_between_two_traced_pages_reads_the_device_once(e1000_on_the_exerciser, mode):
    """A movsl from a register that clears when read (e1000's ICR) to
    another traced page of the BAR: the register is read once, so the
    destination gets the cause, as untraced.  Emulated: the read and the
    write.  Under --singlestep (two traced operands: stepped with the pages
    present): one UNKNOWN record; a step that made only the source's page
    present faulted on the destination's and ran the instruction again,
    which read ICR a second time and copied 0."""
    ensure_helper()
    dev = e1000_on_the_exerciser
    untraced = movs_from_icr(dev)
    assert untraced == E1000_CAUSE, hex(untraced)
    args = ["--singlestep"] if mode == "singlestep" else []
    # the test's own accesses through resource0 are not the subject
    t = NgTracer(["--pci", dev.name, "--no-user", *args], f"ng-movs-icr-{mode}").start()
    got: list[int] = []
    try:
        text = t.section(lambda: got.append(movs_from_icr(dev)))
    finally:
        assert t.stop() == 0
    assert got == [untraced], [hex(v) for v in got]
    recs = [r for r in to_records(text, dev.bars[0][0]) if r[0] in ("R", "W", "UNKNOWN")]
    if mode == "emulate":
        assert recs == [("R", 4, E1000_ICR, untraced), ("W", 4, E1000_RDBAL, untraced)], text
    else:
        assert len(recs) == 1 and recs[0][:2] == ("UNKNOWN", E1000_ICR), text
    assert helper_status()["armed_pages"] == 0


def test_accesses_across_a_page_are_emulated_and_traced(exerciser):
    """An access across BAR0's first page (readl/writel at 0xffe, readq at
    0xffc) is emulated through the two-page window, not single-stepped,
    traced with the value the driver got, and leaves nothing armed (it
    used to re-enter the fault handler without end)."""
    ensure_helper()
    untraced = pagecross_values()
    stepped = helper_status()["singlestepped"]
    t = NgTracer(["--pci", exerciser.dev.name], "ng-pagecross").start()
    try:
        traced = []
        text = t.section(lambda: traced.append(pagecross_values()))
    finally:
        assert t.stop() == 0
    assert traced == [untraced]
    readl, readq = untraced
    recs = [r for r in to_records(text, exerciser.bar0[0]) if r[0] in ("R", "W", "UNKNOWN")]
    assert recs == [("R", 4, 0xFFE, readl), ("W", 4, 0xFFE, 0x5A5A5A5A),
                    ("R", 8, 0xFFC, readq)], text
    st = helper_status()
    assert st["armed_pages"] == 0 and st["mappings"] == 0, st
    assert st["singlestepped"] == stepped, st
    exerciser.run("readl")


CROSSIRQ_ROUNDS = 50


def test_an_access_across_a_page_leaves_other_cpus_trapping(exerciser):
    """Item 7: a readq across BAR0's first two pages inside a 1 ms section
    with interrupts off, 50 times, while the next CPU reads 0x20 in a loop:
    every read of the other CPU is traced (a page made present for the
    readq stays present for other CPUs until interrupts are on again), and
    each readq is traced with its value."""
    ensure_helper()
    base = exerciser.bar0[0]
    t = NgTracer(["--pci", exerciser.dev.name], "ng-crossirq").start()
    try:
        text = t.section(lambda: stress(f"crossirq {CROSSIRQ_ROUNDS}"))
    finally:
        assert t.stop() == 0
    assert not re.search(r"^MARK .*Lost \d+ events", text, re.M), "events lost"
    reads = dbg("crossirq_reads")
    recs = to_records(text, base)
    status_reads = [r for r in recs if r[:3] == ("R", 4, 0x20)]
    readqs = [r for r in recs if r[:3] == ("R", 8, 0xFFC)]
    print(f"{reads} reads of 0x20 made, {len(status_reads)} traced")
    assert len(readqs) == CROSSIRQ_ROUNDS, text[-3000:]
    assert reads > CROSSIRQ_ROUNDS
    assert len(status_reads) == reads, f"{reads - len(status_reads)} reads of 0x20 not traced"
    assert set(status_reads) == {("R", 4, 0x20, 0)}


# ---- item 8: rmmod with trace_marker writes in flight ---------------------

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.write.restype = ctypes.c_ssize_t
libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_DONTNEED = 4
MARK_CYCLES = 8


class MarkerWriter(threading.Thread):
    """Writes 64-byte markers in a loop on one CPU, from a page that is
    there or from one that cannot be read (PROT_NONE: the kernel's copy
    fails, EFAULT, "<faulted>", on every kernel; an untouched page is
    faulted in by the marker write of newer kernels)."""

    def __init__(self, cpu: int, faulting: bool) -> None:
        super().__init__(daemon=True)
        self.cpu = cpu
        prot = 0 if faulting else mmap.PROT_READ | mmap.PROT_WRITE      # 0: PROT_NONE
        self.page = libc.mmap(None, PAGE, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        assert self.page not in (None, ctypes.c_void_p(-1).value)
        if not faulting:
            ctypes.memmove(self.page, b"ng-marker-in-flight\n".ljust(64, b"x"), 64)
        self.writes = self.faulted = 0
        self.stop = threading.Event()

    def run(self) -> None:
        os.sched_setaffinity(0, {self.cpu})      # this thread only
        fd = os.open(MARKER, os.O_WRONLY)
        try:
            while not self.stop.is_set():
                if libc.write(fd, self.page, 64) < 0:
                    self.faulted += 1
                self.writes += 1
        finally:
            os.close(fd)

    def moving(self, timeout: float = 10.0) -> bool:
        n0, deadline = self.writes, time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.writes > n0:
                return True
            time.sleep(0.01)
        return False


def rmmod_within(timeout: float) -> None:
    """rmmod mmiotng; fails at once if it does not return in time (a task
    stuck in the kernel cannot be waited for)."""
    p = subprocess.Popen(["rmmod", "mmiotng"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while p.poll() is None:
        if time.monotonic() > deadline:
            pytest.fail(f"rmmod mmiotng did not return in {timeout:.0f} s", pytrace=False)
        time.sleep(0.05)
    assert p.returncode == 0, f"rmmod mmiotng refused: {p.stderr.read().strip()}"


@pytest.mark.single_tcg
def test_rmmod_with_marker_writes_in_flight(exerciser):
    """Item 8: the helper is unloaded and loaded again while trace_marker is
    written in a loop on the other CPU, from a page that is there and from
    one that is not: every rmmod returns, the writers never stop, and the
    kernel log stays clean.

    Runs in a guest with single-threaded TCG (tests/run runs these apart):
    QEMU's multi-threaded TCG misses the cross-modifying code of a kprobe
    removal at a site that another vCPU executes in a loop, and that vCPU
    then retries for ever the int3 that is no longer in memory (a bare
    eight-line kretprobe module on tracing_mark_write hangs the writers the
    same way, and gdb single-stepping the stuck vCPU runs on past it)."""
    ensure_helper()
    Path("/sys/kernel/tracing/tracing_on").write_text("1\n")
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "needs two CPUs"
    me = os.sched_getaffinity(0)
    writers = [MarkerWriter(cpus[1], faulting=False), MarkerWriter(cpus[1], faulting=True)]
    os.sched_setaffinity(0, {cpus[0]})
    try:
        for w in writers:
            w.start()
        for cycle in range(MARK_CYCLES):
            time.sleep(0.5)          # long enough for the probe to be optimized
            rmmod_within(60)
            for w in writers:
                assert w.moving(), f"a marker writer stopped after rmmod #{cycle}"
            subprocess.run(["insmod", str(REPO / "kmod" / "mmiotng.ko")], check=True,
                           timeout=60)
            for w in writers:
                assert w.moving(), f"a marker writer stopped after insmod #{cycle}"
    finally:
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join(30)
        os.sched_setaffinity(0, me)
        ensure_helper()
    assert not any(w.is_alive() for w in writers), "a marker write never completed"
    print(f"{[w.writes for w in writers]} writes, {writers[1].faulted} faulted")
    assert writers[0].faulted == 0 and writers[1].faulted == writers[1].writes > 0


# ---- item 7(a): a string copy between a BAR and a user page not yet there ----

BAR_READ = EXERCISER_DEBUGFS / "bar_read"
COPY_LEN = 256          # >= 64: copy_to_user is one rep movsb with ERMS
COPY_ROUNDS = 20
libc.pread.restype = ctypes.c_ssize_t
libc.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]


def test_copy_to_user_from_bar_into_missing_page(exerciser):
    """copy_to_user() from the BAR into a page that is not faulted in yet,
    while a burst runs on both CPUs: every byte is read from the device
    exactly once (no element read again by a fallback), nothing is
    single-stepped, the reader gets the device's bytes, nothing hangs."""
    ensure_helper()
    base = exerciser.bar0[0]
    buf = libc.mmap(None, PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert buf not in (None, ctypes.c_void_p(-1).value)
    t = NgTracer(["--pci", exerciser.dev.name], "ng-copy-user").start()
    got: list[bytes] = []

    def reads() -> None:
        burst = threading.Thread(target=exerciser.run, args=("burst", 20_000))
        burst.start()
        fd = os.open(BAR_READ, os.O_RDONLY)
        try:
            for _ in range(COPY_ROUNDS):
                assert libc.madvise(buf, PAGE, MADV_DONTNEED) == 0   # gone again
                n = libc.pread(fd, buf, COPY_LEN, 0x1000)
                assert n == COPY_LEN, os.strerror(ctypes.get_errno())
                got.append(ctypes.string_at(buf, COPY_LEN))
        finally:
            os.close(fd)
            burst.join(300)
        assert not burst.is_alive()

    try:
        before = status()
        text = t.section(reads)
        after = status()
    finally:
        assert t.stop() == 0
    # Each round reads 0x1000..0x10ff from the device exactly once, in order,
    # in the widths the kernel's copy_to_user() uses (rep movsb on 6.1 with
    # ERMS, 8-byte moves elsewhere), and the reader got those values.  A
    # round's mapping may be one the helper could not arm (its spare
    # mappings used up by ioremaps faster than it refills them): it is then
    # not traced, and says so in the stream.
    untraced = len(re.findall(rf"^MARK .* ioremap of 0x{base:x} size .* is NOT traced: ",
                              text, re.M))
    recs = [r for r in to_records(text, base) if r[0] in ("R", "W", "UNKNOWN") and
            (r[1] if r[0] == "UNKNOWN" else r[2]) >= 0x1000]
    assert all(r[0] == "R" for r in recs), [r for r in recs if r[0] != "R"][:5]
    rounds: list[bytes] = []
    data, pos = b"", 0x1000
    for _op, width, off, value in recs:
        assert off == pos, (off, pos)
        data += value.to_bytes(width, "little")
        pos += width
        if pos == 0x1000 + COPY_LEN:
            rounds.append(data)
            data, pos = b"", 0x1000
    assert pos == 0x1000 and len(got) == COPY_ROUNDS
    assert all(r in got for r in rounds)
    assert COPY_ROUNDS // 2 <= len(rounds) <= COPY_ROUNDS <= len(rounds) + untraced, \
        (len(rounds), untraced)
    # outside PREEMPT_RT the probe allocates a mapping when the spares are used up
    assert untraced == 0 or REALTIME, untraced
    assert after.singlestepped == before.singlestepped
    assert exerciser.mismatches() == 0


# ---- a copy to user memory that must not be stepped where it may sleep -------

KPROBE_EVENTS = Path("/sys/kernel/tracing/kprobe_events")
STEP_COPY_ROUNDS = 40
CHURN_BYTES = 32 << 20
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


@pytest.fixture
def another_probe_on_the_fault_hook():
    """A kprobe event on bad_area_nosemaphore, enabled: a second ftrace user
    on the hooked function, so that ftrace calls the callbacks with
    preemption disabled (a sleepable context then looks atomic there)."""
    def add(line: str) -> None:     # appended: other probes stay
        fd = os.open(KPROBE_EVENTS, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    add("p:ngtest/other bad_area_nosemaphore\n")
    enable = Path("/sys/kernel/tracing/events/ngtest/other/enable")
    enable.write_text("1\n")
    try:
        yield
    finally:
        enable.write_text("0\n")
        add("-:ngtest/other\n")


@pytest.mark.parametrize("mode", [[], ["--singlestep"]], ids=["emulate", "singlestep"])
def test_copy_to_user_that_may_sleep_is_never_stepped_asleep(exerciser, mode,
                                                              another_probe_on_the_fault_hook):
    """copy_to_user() from the BAR into a page that is gone (MADV_DONTNEED)
    while another thread of the process maps and unmaps in a loop (the
    fault on the user page then waits for mmap_lock: it sleeps) and a third
    moves the reader between the CPUs, with another kprobe on the hooked
    function, emulating and under --singlestep.  A step that slept would
    end on another CPU: its trap unclaimed (the kernel WARNs at a stray
    single-step trap), its page left present, or the session's end waiting
    for it for ever.  Every read gets the device's bytes, each round's bytes
    are recorded once, the page tables show nothing armed afterwards, and
    the helper unloads."""
    ensure_helper()
    base = exerciser.bar0[0]
    fd = os.open(BAR_READ, os.O_RDONLY)
    ref = os.pread(fd, COPY_LEN, 0x1000)        # untraced: the device's bytes
    buf = libc.mmap(None, PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert buf not in (None, ctypes.c_void_p(-1).value)
    got: list[bytes] = []
    stop = threading.Event()

    # mmap_lock held for writing most of the time: mprotect of a populated
    # region rewrites all its entries under it
    region = mmap.mmap(-1, CHURN_BYTES)
    region.write(b"\1" * CHURN_BYTES)
    raddr = ctypes.addressof(ctypes.c_char.from_buffer(region))

    def churn() -> None:
        prot = [mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE]
        i = 0
        while not stop.is_set():
            assert libc.mprotect(raddr, CHURN_BYTES, prot[i & 1]) == 0
            i += 1

    reader_tid: list[int] = []

    def flip() -> None:             # the reader moves between the CPUs
        cpu = 0
        while not stop.is_set():
            if reader_tid:
                os.sched_setaffinity(reader_tid[0], {cpu})
                cpu ^= 1
            time.sleep(0.002)

    def reads() -> None:
        reader_tid.append(threading.get_native_id())
        helpers = [threading.Thread(target=churn), threading.Thread(target=flip)]
        for h in helpers:
            h.start()
        try:
            for _ in range(STEP_COPY_ROUNDS):
                assert libc.madvise(buf, PAGE, MADV_DONTNEED) == 0
                n = libc.pread(fd, buf, COPY_LEN, 0x1000)
                assert n == COPY_LEN, os.strerror(ctypes.get_errno())
                got.append(ctypes.string_at(buf, COPY_LEN))
        finally:
            stop.set()
            for h in helpers:
                h.join(60)
            os.sched_setaffinity(0, {0, 1})

    t = NgTracer(["--pci", exerciser.dev.name, *mode], "ng-copy-sleep").start()
    try:
        text = t.section(reads)
    finally:
        rc = t.stop()
        os.close(fd)
    assert rc == 0
    assert got == [ref] * STEP_COPY_ROUNDS
    # each round's bytes once, in order: emulated reads, or one UNKNOWN
    # record per stepped element (a stepped movs is not decoded)
    recs = [r for r in to_records(text, base) if r[0] in ("R", "UNKNOWN") and
            (r[1] if r[0] == "UNKNOWN" else r[2]) >= 0x1000]
    untraced = len(re.findall(rf"^MARK .* ioremap of 0x{base:x} size .* is NOT traced: ",
                              text, re.M))
    if not mode:
        assert all(r[0] == "R" for r in recs), recs[:5]
    spans = [(r[1], 1) if r[0] == "UNKNOWN" else (r[2], r[1]) for r in recs]
    rounds, pos = 0, 0x1000
    for off, width in spans:
        assert off == pos, (off, pos)
        pos += width
        if pos == 0x1000 + COPY_LEN:
            rounds, pos = rounds + 1, 0x1000
    assert pos == 0x1000 and rounds + untraced == STEP_COPY_ROUNDS, (rounds, untraced)
    assert rounds >= STEP_COPY_ROUNDS // 2, rounds
    assert status().armed_pages == 0
    # nothing left armed or present-for-a-step: the exerciser's own page walk
    hold = EXERCISER_DEBUGFS / "hold"
    hold.write_text("map\n")
    try:
        m = re.search(r"pages (\d+) present (\d+)", hold.read_text())
        assert m and m[1] == m[2], hold.read_text()
    finally:
        hold.write_text("unmap\n")
    # the session's end waited for no step: the helper unloads
    subprocess.run(["rmmod", "mmiotng"], check=True, timeout=120)
    assert not Path("/sys/module/mmiotng").exists()
    ensure_helper()


# ---- a copy that waits without bound for its user page ----------------------

NR_USERFAULTFD = 323            # x86_64
UFFD_API = 0xAA
UFFDIO_API = 0xC018AA3F         # _IOWR(0xAA, 0x3F, struct uffdio_api)
UFFDIO_REGISTER = 0xC020AA00    # _IOWR(0xAA, 0x00, struct uffdio_register)
UFFDIO_ZEROPAGE = 0xC020AA04    # _IOWR(0xAA, 0x04, struct uffdio_zeropage)
UFFDIO_REGISTER_MODE_MISSING = 1
UFFD_EVENT_PAGEFAULT = 0x12
libc.syscall.restype = ctypes.c_long
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


class UserfaultPage:
    """An anonymous page served by userfaultfd that nobody serves until
    serve(): a fault on it, a kernel one too, waits until then (as on a
    page of a FUSE file whose server does not answer)."""

    def __init__(self) -> None:
        self.fd = libc.syscall(NR_USERFAULTFD, os.O_CLOEXEC | os.O_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        api = (ctypes.c_uint64 * 3)(UFFD_API, 0, 0)
        assert libc.ioctl(self.fd, UFFDIO_API, api) == 0, os.strerror(ctypes.get_errno())
        self.addr = libc.mmap(None, PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                              mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        assert self.addr not in (None, ctypes.c_void_p(-1).value)
        reg = (ctypes.c_uint64 * 4)(self.addr, PAGE, UFFDIO_REGISTER_MODE_MISSING, 0)
        assert libc.ioctl(self.fd, UFFDIO_REGISTER, reg) == 0, os.strerror(ctypes.get_errno())

    def wait_fault(self, timeout: float) -> int:
        """The address of the first fault on the page, once one waits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = os.read(self.fd, 32)      # struct uffd_msg
            except BlockingIOError:
                time.sleep(0.05)
                continue
            assert msg[0] == UFFD_EVENT_PAGEFAULT, msg
            return int.from_bytes(msg[16:24], "little")
        raise AssertionError("nothing faulted on the userfaultfd page")

    def serve(self) -> None:
        zero = (ctypes.c_uint64 * 4)(self.addr, PAGE, 0, 0)
        assert libc.ioctl(self.fd, UFFDIO_ZEROPAGE, zero) == 0, os.strerror(ctypes.get_errno())

    def close(self) -> None:
        os.close(self.fd)


@pytest.mark.parametrize("force", [False, True], ids=["rmmod", "rmmod-f"])
def test_unload_while_a_copy_waits_for_its_user_page(exerciser, force):
    """copy_to_user() from the BAR into a page whose fault waits until a
    user-space server answers (userfaultfd here, a FUSE file's page in the
    wild): the helper faults the page in from the fault path and so waits
    with it.  The session ends meanwhile; rmmod of the helper then fails at
    once ("in use") instead of waiting as long as the page does; once the
    page is served, the copy completes with the device's bytes and the
    helper unloads.  rmmod -f (Debian's kernels allow it) does not free the
    module under the waiting task: it waits for the page too."""
    ensure_helper()
    fd = os.open(BAR_READ, os.O_RDONLY)
    ref = os.pread(fd, COPY_LEN, 0x1000)        # untraced: the device's bytes
    page = UserfaultPage()
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.append(
        libc.pread(fd, page.addr, COPY_LEN, 0x1000)))
    t = NgTracer(["--pci", exerciser.dev.name], "ng-copy-uffd").start()
    rmmod = None
    try:
        reader.start()
        assert page.wait_fault(60) == page.addr
        time.sleep(0.5)
        assert reader.is_alive()
        assert t.stop() == 0
        rmmod = subprocess.Popen(["rmmod", *(["-f"] if force else []), "mmiotng"],
                                 stderr=subprocess.PIPE, text=True)
        try:
            rc = rmmod.wait(30 if not force else 5)
        except subprocess.TimeoutExpired:
            rc = None
        if force:
            assert rc is None and reader.is_alive(), "the forced unload did not wait"
        else:
            assert rc is not None, "rmmod waits as long as the user page does"
            assert rc != 0 and "in use" in rmmod.stderr.read(), rc
            assert Path("/sys/module/mmiotng").exists()
    finally:
        page.serve()                            # the copy goes on
        reader.join(60)
        if rmmod is not None:
            rc = rmmod.wait(120)
        if t.proc.poll() is None:
            t.stop()
        os.close(fd)
        page.close()
    assert not reader.is_alive() and got == [COPY_LEN], got
    assert ctypes.string_at(page.addr, COPY_LEN) == ref
    if force:
        assert rc == 0 and not Path("/sys/module/mmiotng").exists(), rc
    else:
        rmmod_helper()
    ensure_helper()


# ---- more mappings than the helper keeps spares for --------------------------

MAPLOOP_N = 300


def test_mappings_made_faster_than_the_spares_refill_are_traced(exerciser):
    """A driver maps and unmaps a page of BAR0 300 times from a SCHED_FIFO
    task pinned to CPU 1, where the helper's refill work (a normal kernel
    worker on that CPU) cannot run until it is done: more mappings than the
    helper keeps spares for.  Outside PREEMPT_RT every one is traced (the
    probe allocates when the spares are used up); on PREEMPT_RT, where the
    probe must not allocate, a mapping can be NOT traced, and is said so.
    Either way the traced and the said make all 300, and every traced one
    has its read."""
    ensure_helper()
    base = exerciser.bar0[0]
    t = NgTracer(["--pci", exerciser.dev.name], "ng-maploop").start()
    try:
        text = t.section(lambda: subprocess.run(
            ["taskset", "-c", "1", "chrt", "-f", "10", "sh", "-c",
             f'echo "maploop {MAPLOOP_N}" > {STRESS}'], check=True, timeout=600))
    finally:
        assert t.stop() == 0
    maps = re.findall(rf"^MAP \S+ (\d+) 0x{base:x} 0x[0-9a-f]+ 0x1000 ", text, re.M)
    said = re.findall(rf"^MARK .* ioremap of 0x{base:x} size 0x1000 at \S+ is NOT traced: (.*)$",
                      text, re.M)
    reads = [r for r in to_records(text, base) if r[0] == "R"]
    assert len(maps) + len(said) == MAPLOOP_N, (len(maps), said[:3])
    assert reads == [("R", 4, 0, IDENT)] * len(maps)
    assert said == [] or (REALTIME and set(said) == {"the helper ran out of memory"}), said[:3]
    st = status()
    assert st.armed_pages == 0 and st.mappings == 0, st
    assert exerciser.mismatches() == 0


# ---- ioremaps the probe misses are said -----------------------------------

MISS_MAPS = 200


def test_ioremaps_the_probe_misses_are_said(exerciser):
    """With one kretprobe instance for the ioremap probe, held 1 ms longer
    (test_maxactive=1), two kernel threads mapping a page of BAR0 in a loop,
    one on each CPU (maploop2), make the probe miss calls: STATUS counts
    them, the trace says them (NOT traced), and every mapping is either
    traced (its MAP line and its read) or one of those said."""
    subprocess.run(["rmmod", "mmiotng"], capture_output=True)
    subprocess.run(["insmod", str(HELPER_KO), "test_maxactive=1"], check=True)
    try:
        base = exerciser.bar0[0]
        t = NgTracer(["--pci", exerciser.dev.name], "ng-missed").start()
        try:
            def maploops() -> None:
                stress(f"maploop2 {MISS_MAPS}")
                status()        # a command: the helper says the misses now
            text = t.section(maploops)
            missed = status().missed
        finally:
            assert t.stop() == 0
    finally:
        subprocess.run(["rmmod", "mmiotng"], check=True)
        ensure_helper()
    maps = re.findall(rf"^MAP \S+ \d+ 0x{base:x} 0x[0-9a-f]+ 0x1000 ", text, re.M)
    said = [int(n) for n in re.findall(r"^MARK .* probes missed (\d+) calls: .* NOT traced$",
                                         text, re.M)]
    reads = [r for r in to_records(text, base) if r[0] == "R"]
    print(f"{len(maps)} traced, {sum(said)} missed ({missed} counted)")
    assert missed > 0 and sum(said) == missed, (said, missed)
    assert len(maps) + sum(said) == 2 * MISS_MAPS
    assert reads == [("R", 4, 0, IDENT)] * len(maps)


# ---- item 9: the kernel's own mmiotrace and a session exclude each other ----

CURRENT_TRACER = Path("/sys/kernel/tracing/current_tracer")
EXCLUSION_SECONDS = stress_length(10.0)


def test_kernel_tracer_and_session_exclude_each_other(exerciser):
    """One thread starts and stops the kernel's mmiotrace in a loop while
    another opens a session (FILTER_ADD) and ends it in a loop: at no time
    are both on.  Each side checks the other after it got in."""
    ensure_helper()
    start, length = exerciser.bar0
    assert CURRENT_TRACER.read_text().strip() == "nop"
    stop = threading.Event()
    both: list[str] = []
    counts = {"kernel on": 0, "kernel refused": 0, "session on": 0, "session refused": 0}

    def kernel_loop() -> None:
        while not stop.is_set():
            try:
                CURRENT_TRACER.write_text("mmiotrace\n")
            except OSError as exc:
                assert exc.errno == errno.EBUSY, exc
                counts["kernel refused"] += 1
                time.sleep(0.01)
                continue
            counts["kernel on"] += 1
            st = status()
            if st.owner or st.filters:
                both.append(f"kernel tracer on while the helper has {st}")
            CURRENT_TRACER.write_text("nop\n")

    th = threading.Thread(target=kernel_loop, daemon=True)
    th.start()
    deadline = time.monotonic() + EXCLUSION_SECONDS
    try:
        while time.monotonic() < deadline:
            with nl.HelperSocket() as h:
                try:
                    h.filter_add(start, length)
                except nl.HelperError as exc:
                    assert exc.errno == errno.EBUSY, exc
                    counts["session refused"] += 1
                    continue
                counts["session on"] += 1
                if CURRENT_TRACER.read_text().strip() == "mmiotrace":
                    both.append("a session got in while the kernel's mmiotrace is on")
                h.disarm_all()
    finally:
        stop.set()
        th.join(120)
        CURRENT_TRACER.write_text("nop\n")
    print("exclusion loop:", counts)
    assert not th.is_alive()
    assert not both, both
    assert counts["kernel on"] and counts["session on"], counts
    st = status()
    assert st.owner == 0 and st.filters == 0 and st.armed_pages == 0, st


# ---- issue 28 item 6: MMIO in NMI handlers ----

NMI_ROUNDS = 5000       # maploop rounds on the first CPU while NMIs come in


@pytest.mark.parametrize("mode", [[], ["--singlestep"]], ids=["emulate", "singlestep"])
def test_mmio_in_nmis_during_traced_accesses_is_traced(exerciser, mode):
    """The first CPU maps a page of BAR0, reads it and unmaps it in a loop
    (the ioremap and iounmap probes take the helper's lock; under
    --singlestep each read is a single-step) while the second CPU sends it
    NMIs, one at a time, whose handler reads the status register and every
    second time also the irq status register.  Nothing hangs (an NMI on top
    of the helper's lock, or of a step's trap, waits for nothing and steps
    nothing), every read gets the device's value, and every access made in
    an NMI is in the trace, once: none went through untraced, none was
    lost (the BPF program does not run where it interrupted itself)."""
    ensure_helper()
    base = exerciser.bar0[0]
    (EXERCISER_DEBUGFS / "nmi_unknown").write_text("0\n")
    t = NgTracer(["--pci", exerciser.dev.name, *mode], "ng-nmi").start()
    try:
        text = t.section(lambda: stress(f"nmi {NMI_ROUNDS}"))
    finally:
        assert t.stop() == 0
    nmis, second = dbg("nmi_reads"), dbg("nmi_second")
    recs = to_records(text, base)
    print(f"{nmis} NMIs, {second} second reads; {len(recs)} records")
    assert nmis > 50 and second == nmis // 2
    assert [r for r in recs if r[0] == "LOST"] == []
    assert [r for r in recs if r[:3] == ("R", 4, 0x20)] == [("R", 4, 0x20, 0)] * nmis
    assert [r for r in recs if r[:3] == ("R", 4, 0x24)] == [("R", 4, 0x24, 0)] * second
    # the loop's mappings: each traced with its read, or (PREEMPT_RT only,
    # where the probe does not allocate) said NOT traced
    maps = re.findall(rf"^MAP \S+ \d+ 0x{base:x} 0x[0-9a-f]+ 0x1000 ", text, re.M)
    said = re.findall(rf"^MARK .* ioremap of 0x{base:x} size 0x1000 at \S+ is NOT traced: (.*)$",
                      text, re.M)
    assert len(maps) + len(said) == NMI_ROUNDS, (len(maps), said[:3])
    assert said == [] or (REALTIME and set(said) == {"the helper ran out of memory"}), said[:3]
    assert [r for r in recs if r[:3] == ("R", 4, 0)] == [("R", 4, 0, IDENT)] * len(maps)


def test_mmio_in_an_nmi_that_cannot_be_emulated_gives_its_page_up(exerciser):
    """An NMI handler that tests 0x00 with a testl (an instruction the
    decoder does not know, which elsewhere is single-stepped; an NMI is
    never stepped): its page is given back for good and the trace
    says so, nothing hangs, the loop's own mapping stays traced and the
    helper unloads."""
    ensure_helper()
    base = exerciser.bar0[0]
    (EXERCISER_DEBUGFS / "nmi_unknown").write_text("1\n")
    try:
        t = NgTracer(["--pci", exerciser.dev.name], "ng-nmi-unknown").start()
        try:
            text = t.section(lambda: stress("nmi 300"))
        finally:
            assert t.stop() == 0
    finally:
        (EXERCISER_DEBUGFS / "nmi_unknown").write_text("0\n")
    said = re.findall(r"^MARK .* is NOT traced: an access in an NMI could not be emulated",
                      text, re.M)
    recs = to_records(text, base)
    print(f"{dbg('nmi_reads')} NMIs; said {len(said)} times")
    assert dbg("nmi_second") > 0
    assert len(said) >= 1
    assert [r for r in recs if r[0] == "UNKNOWN"] == []
    # the loop's mappings: each traced with its read, or (PREEMPT_RT only,
    # where the probe does not allocate) said NOT traced
    maps = re.findall(rf"^MAP \S+ \d+ 0x{base:x} 0x[0-9a-f]+ 0x1000 ", text, re.M)
    short = re.findall(rf"^MARK .* ioremap of 0x{base:x} size 0x1000 at \S+ is NOT traced: "
                       r"the helper ran out of memory$", text, re.M)
    assert len(maps) + len(short) == 300 and (short == [] or REALTIME), (len(maps), len(short))
    assert [r for r in recs if r[:3] == ("R", 4, 0)] == [("R", 4, 0, IDENT)] * len(maps)
    subprocess.run(["rmmod", "mmiotng"], check=True)
    ensure_helper()


# ---- issue 28 item 9: a copy to user memory that SMAP refuses ----------------


@pytest.mark.oops
def test_a_copy_to_user_memory_without_stac_oopses_as_untraced(exerciser, dmesg_clean):
    """A driver's movs from the BAR to user memory without stac (EFLAGS.AC
    clear), with SMAP on: without the tracer, the CPU refuses the user side
    and the kernel oopses at the instruction.  Traced, the helper must not
    make the copy work (its own user copies are allowed) nor single-step it
    (the oops would end the task inside the step): it gives the page up,
    the trace says so, and the instruction runs as untraced: the same oops,
    one and no other, the reader killed.  The session ends cleanly and the
    helper unloads.  The kernel is tainted afterwards: the test runs last."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert re.search(r"^flags\s*:.* smap\b", cpuinfo, re.M), "the guest's CPU has no SMAP"
    ensure_helper()
    base = exerciser.bar0[0]
    t = NgTracer(["--pci", exerciser.dev.name], "ng-nostac").start()
    try:
        reader = subprocess.run(
            [PY, "-c", "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
             "print(os.read(fd, 4).hex())", str(EXERCISER_DEBUGFS / "bar_read_nostac")],
            capture_output=True, text=True, timeout=120)
        text = t.wait_for("SMAP refuses")
    finally:
        assert t.stop() == 0
    print(reader)
    assert reader.returncode < 0 and not reader.stdout, "the copy worked: it was emulated"
    said = re.findall(rf"^MARK .* ioremap of 0x{base:x} size \S+ at \S+ is NOT traced: (.*)$",
                      text, re.M)
    assert said == ["an access to user memory without stac, which SMAP refuses: one of its "
                    "pages is not traced from here on"], said
    assert [r for r in to_records(text, base) if r[0] in ("R", "W", "UNKNOWN")] == []
    log = dmesg_clean.all_lines()
    oops = [ln for ln in log if "Oops: " in ln]
    assert len(oops) == 1 and re.search(r"Oops: (Oops: )?000[23] \[#1\]", oops[0]), oops
    assert any(re.search(r"RIP: 0010:edu_bar_read_nostac\+", ln) for ln in log), log
    assert helper_status()["armed_pages"] == 0
    rmmod_helper()
    ensure_helper()


# ---- a kprobe on the traced instruction ------------------------------------

KPROBES_LIST = Path("/sys/kernel/debug/kprobes/list")
KPROBE_PROFILE = Path("/sys/kernel/tracing/kprobe_profile")
KPROBE_ROUNDS = 8
KPROBE_LOOP = 50
W_LIVE = re.compile(r"^W 4 \S+ \S+ (0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+) \d+$")


def kprobe_event(line: str) -> None:
    """Append to kprobe_events (the other probes stay)."""
    fd = os.open(KPROBE_EVENTS, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# it patches the loop's code while another vCPU runs it (conftest.py)
@pytest.mark.single_tcg
@pytest.mark.parametrize("mode", [[], ["--sync"]], ids=["emulate", "sync"])
def test_a_kprobe_on_the_traced_instruction(exerciser, mode):
    """A kprobe put on wloop's writel and taken off again, round after
    round, while wloop runs traced: the probe's copy of the store faults in
    its buffer, and kprobes' optimizer writes a 5-byte jump over that
    3-byte store and the instruction after it once RCU Tasks says no task
    is between them.  With --sync the task waits after each store, its
    registers pointing right after it: a wait that slept would count as out
    of that text, and the task would go on in the middle of the jump (each
    round stops the tracer while the probe goes in, so that a store waits
    for it then).  Every store is recorded once, in order, with its value; the probe fired
    (and was optimized where the kernel optimizes probes); the kernel log
    stays clean."""
    ensure_helper()
    base = exerciser.bar0[0]
    t = NgTracer(["--pci", exerciser.dev.name, "--pc"], "ng-kprobe-pc").start()
    try:
        text = t.section(lambda: exerciser.run("wloop", 4))
    finally:
        assert t.stop() == 0
    pcs = {int(m[3], 16) for m in map(W_LIVE.match, text.splitlines())
           if m and int(m[1], 16) == base + 4}
    assert len(pcs) == 1, text          # the one store of the loop
    pc = pcs.pop()
    optimizing = Path("/proc/sys/debug/kprobes-optimization").read_text().strip() == "1"
    sync = "--sync" in mode
    runs, errors = [0], []
    stop = threading.Event()

    def loops() -> None:
        try:
            while not stop.is_set():
                exerciser.run("wloop", KPROBE_LOOP)
                runs[0] += 1
                time.sleep(0.02)        # a stopped tracer's ring holds what comes meanwhile
        except OSError as exc:
            errors.append(exc)

    hits = optimized = 0

    def is_optimized() -> bool:
        return any(line.startswith(f"{pc:x} ") and "[OPTIMIZED]" in line
                   for line in KPROBES_LIST.read_text().splitlines())

    def probe_rounds() -> None:
        nonlocal hits, optimized
        th = threading.Thread(target=loops)
        th.start()
        try:
            for _ in range(KPROBE_ROUNDS):
                if sync:
                    # the next store waits for the stopped tracer (up to
                    # 1 s), its registers right after the store
                    os.killpg(t.proc.pid, signal.SIGSTOP)
                    time.sleep(0.1)
                kprobe_event(f"p:ngtest/mmio 0x{pc:x}\n")
                enable = Path("/sys/kernel/tracing/events/ngtest/mmio/enable")
                enable.write_text("1\n")
                time.sleep(0.5)         # the optimizer waits 5 jiffies, then RCU Tasks
                seen = is_optimized()
                if sync:
                    os.killpg(t.proc.pid, signal.SIGCONT)
                time.sleep(0.3)
                optimized += seen or is_optimized()
                for line in KPROBE_PROFILE.read_text().splitlines():
                    if line.split()[:1] == ["mmio"]:
                        hits += int(line.split()[1])
                enable.write_text("0\n")
                kprobe_event("-:ngtest/mmio\n")
                time.sleep(0.05)
        finally:
            if sync:
                os.killpg(t.proc.pid, signal.SIGCONT)
            stop.set()
            th.join(300)

    name = "ng-kprobe-" + ("-".join(m.strip("-") for m in mode) or "emulate")
    t = NgTracer(["--pci", exerciser.dev.name, *mode], name).start()
    try:
        text = t.section(probe_rounds)
    finally:
        rc = t.stop()
    print(f"kprobe at {pc:#x}: {runs[0]} runs of wloop {KPROBE_LOOP}, {hits} hits, "
          f"optimized in {optimized} of {KPROBE_ROUNDS} rounds (optimizing: {optimizing})")
    assert rc == 0 and not errors, (rc, errors)
    # a store that faults where the probe's int3 is (the probe's copy faulted
    # and kprobes put the registers back there) is stepped, not decoded: an
    # UNKNOWN record at its place, the int3 first in its bytes
    recs = [r for r in to_records(text, base)
            if r[:3] == ("W", 4, 4) or r[:2] == ("UNKNOWN", 4)]
    got = [r[3] if r[0] == "W" else None for r in recs]
    expected = list(range(KPROBE_LOOP)) * runs[0]
    assert runs[0] >= 2 and len(got) == len(expected), (runs[0], len(got))
    assert all(g in (None, e) for g, e in zip(got, expected, strict=True))
    stepped = [r[2] for r in recs if r[0] == "UNKNOWN"]
    assert all(b[0] == 0xCC for b in stepped) and len(stepped) <= KPROBE_ROUNDS, stepped
    assert hits > 0
    assert optimized > 0 or not optimizing, "the probe was never optimized"
    assert exerciser.mismatches() == 0
