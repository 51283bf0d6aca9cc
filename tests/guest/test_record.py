"""record and report in the guest: a recording prints as the truth of each
scenario, keeps the traced machine's symbols, selects BARs, survives a
SIGKILL without leaving anything armed, and keeps a sustained loop whole."""

from __future__ import annotations

import errno
import mmap
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from held import assert_left_whole, ensure_helper, held_pages, hold
from kernel_tracer import PciDevice, find_pci_devices, to_records
from ng_tracer import ARTIFACTS, NG, helper_status, recorded_for_host, sections
from test_ng_trace import COMPARED, count_for, decoded

from mmiotrace_ng.format.rawfile import open_recording

RUN = Path("/sys/kernel/debug/edu_exerciser/run")
MARKER = "/sys/kernel/tracing/trace_marker"
IVSHMEM = (0x1AF4, 0x1110)      # QEMU's ivshmem-plain: memory BARs 0 and 2
EXERCISER_DRIVER = Path("/sys/bus/pci/drivers/edu_exerciser")


def record(args: list[str], name: str, cmd: list[str],
           timeout: float = 600) -> tuple[Path, subprocess.CompletedProcess]:
    path = ARTIFACTS / f"{name}.rec"
    ARTIFACTS.mkdir(exist_ok=True)
    res = subprocess.run([*NG, "record", *args, "-o", str(path), "--", *cmd],
                         capture_output=True, text=True, timeout=timeout)
    (ARTIFACTS / f"{name}.err").write_text(res.stderr)
    return path, res


def report(path: Path, *opts: str) -> str:
    res = subprocess.run([*NG, "report", *opts, str(path)], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    return res.stdout


def test_recorded_scenarios_are_the_truth(exerciser):
    """Every scenario, each between two markers, recorded while a shell runs
    them: report prints each as its documented sequence; the file says which
    kernel it was made on and resolves the exerciser's functions."""
    script = []
    for i, name in enumerate(COMPARED, 1):
        count = count_for(name)
        line = name if count is None else f"{name} {count}"
        script += [f"echo ng-section-begin-{i} > {MARKER}", f"echo '{line}' > {RUN}",
                   f"echo ng-section-end-{i} > {MARKER}"]
    path, res = record(["--pci", exerciser.dev.name], "ng-record",
                       ["sh", "-c", "; ".join(script)])
    assert res.returncode == 0, res.stderr
    summary = res.stderr.strip().splitlines()[-1]
    assert f"recorded in {path}" in summary and "lost 0" in summary, summary
    got = sections(report(path))
    for i, name in enumerate(COMPARED, 1):
        assert to_records(got[i], exerciser.bar0[0]) == decoded(name, count_for(name)), name
    rec = open_recording(str(path))
    assert rec.meta["kernel"] == os.uname().release and rec.end == {"lost": 0, "pending": 0}
    assert "edu_exerciser" in rec.modules
    assert any(ln.split()[2:4] == ["sc_readl", "[edu_exerciser]"]
               for ln in rec.kallsyms.splitlines() if ln.endswith("[edu_exerciser]"))


def test_a_sustained_loop_is_kept_whole(exerciser):
    """200000 reads in a row on one CPU, as fast as the trap lets them come:
    the recording has each of them, in order, and no loss."""
    n = 200_000
    path, res = record(["--pci", exerciser.dev.name], "ng-record-loop",
                       ["taskset", "-c", "0", "sh", "-c", f"echo 'rloop {n}' > {RUN}"])
    assert res.returncode == 0, res.stderr
    recs = to_records(report(path), exerciser.bar0[0])
    assert recs.count(("R", 4, 0x00, 0x010000ED)) == n
    assert not [r for r in recs if r[0] == "LOST"]


BLIT_BYTES = 16 << 20   # one memcpy_toio: 4194304 movsl stores in one instruction
BLIT_SAMPLES = 4096
# ticks every 10 ms; on SIGTERM prints how many and the longest gap (s)
TICKER = """
import signal, sys, time
ticks, longest, last = 0, 0.0, time.monotonic()
def done(*_):
    print(ticks, longest, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    time.sleep(0.01)
    now = time.monotonic()
    ticks, longest, last = ticks + 1, max(longest, now - last), now
"""
# the blit alone takes 10 s and more here; a task beside it on its CPU
# waits a scheduler's slice or two between the chunks, not the whole blit
TICK_GAP_MAX_S = 2.0


def blit_word(k: int) -> int:
    """The exerciser's blit: the 32-bit word at BAR offset 4k."""
    return (0x9E3779B1 * (k + 1)) & 0xFFFFFFFF


def test_the_default_ring_keeps_a_16_mib_blit(exerciser):
    """One framebuffer-style blit (memcpy_toio of 16 MiB into a
    write-combining mapping of ivshmem's BAR 2: one rep movsl of 4194304
    stores) recorded with record's default ring, which holds a fifth of
    them: nothing lost, every store recorded, and the device's memory
    holds the blit (sampled through sysfs, untraced).  Another task on the
    blit's CPU runs between the chunks of the instruction: the kernel does
    not preempt kernel code, the helper lets the task yield.  That each store is
    in the file, in order, with its value, the host checks (tests/recorded/
    test_recording_blit.py: seconds there, minutes here)."""
    dev = ivshmem_64m()
    blit = Path("/sys/kernel/debug") / f"edu_exerciser-{dev.name}" / "blit"
    # a task that wants CPU 0 every 10 ms while the blit runs there: the
    # helper lets it run between chunks of the one instruction
    ticker = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", TICKER],
                              stdout=subprocess.PIPE, text=True)
    try:
        res = recorded_for_host("blit", [
            "record", "--pci", f"{dev.name}@2", "-o", "{rec}", "--", "taskset", "-c", "0",
            "sh", "-c", f"echo '2 {BLIT_BYTES}' > {blit}"],
            bdf=dev.name, bar0=dev.bars[2][0], blit_bytes=BLIT_BYTES)
    finally:
        ticker.terminate()
        out, _ = ticker.communicate(timeout=60)
    ticks, longest = map(float, out.split())
    assert ticks > 100 and longest < TICK_GAP_MAX_S, out
    m = re.search(r"^mmiotrace-ng: (\d+) records \(map (\d+), unmap (\d+), access (\d+), "
                  r"mark \d+\) recorded in .*, lost (\d+)$", res.stderr, re.M)
    assert m, res.stderr
    records, maps, unmaps, accesses, lost = map(int, m.groups())
    stores = BLIT_BYTES // 4
    assert (records, maps, unmaps, accesses, lost) == (2 + stores, 1, 1, stores, 0), res.stderr
    rng = random.Random(BLIT_BYTES)
    ks = [0, stores - 1, *(rng.randrange(stores) for _ in range(BLIT_SAMPLES))]
    wrong = blit_words_wrong(dev, ks)
    assert wrong == [], wrong[:5]


def blit_words_wrong(dev: PciDevice, ks: list[int]) -> list[tuple[int, int]]:
    """The sampled words of BAR 2 that do not hold the blit's (read through
    sysfs, untraced)."""
    with open(f"/sys/bus/pci/devices/{dev.name}/resource2", "rb") as f, \
            mmap.mmap(f.fileno(), BLIT_BYTES, prot=mmap.PROT_READ) as mem:
        words = memoryview(mem).cast("I")
        try:
            return [(k, words[k]) for k in ks if words[k] != blit_word(k)]
        finally:
            words.release()


def test_a_tracer_killed_while_a_blit_yields_leaves_it_whole(exerciser):
    """SIGKILL of record in the middle of a 16 MiB blit whose task yields
    between the chunks (a task beside it on its CPU): the blit goes on
    untraced and completes, BAR 2 holds all of it, nothing stays armed."""
    dev = ivshmem_64m()
    with open(f"/sys/bus/pci/devices/{dev.name}/resource2", "r+b") as f, \
            mmap.mmap(f.fileno(), BLIT_BYTES) as mem:
        mem[:] = bytes(BLIT_BYTES)       # not the blit of an earlier test
    stores = BLIT_BYTES // 4
    rng = random.Random(BLIT_BYTES + 1)
    ks = [0, stores - 1, *(rng.randrange(stores) for _ in range(BLIT_SAMPLES))]
    assert len(blit_words_wrong(dev, ks)) > BLIT_SAMPLES // 2
    path, errf = ARTIFACTS / "ng-record-blit-kill.rec", ARTIFACTS / "ng-record-blit-kill.err"
    ARTIFACTS.mkdir(exist_ok=True)
    ticker = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", TICKER],
                              stdout=subprocess.PIPE, text=True)
    with open(errf, "wb") as err:
        proc = subprocess.Popen([*NG, "record", "--pci", f"{dev.name}@2", "-o", str(path)],
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    blit = None
    try:
        deadline = time.monotonic() + 300
        while b"mmiotrace-ng: ready" not in errf.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, errf.read_text()
            time.sleep(0.2)
        blitf = Path("/sys/kernel/debug") / f"edu_exerciser-{dev.name}" / "blit"
        blit = subprocess.Popen(["taskset", "-c", "0", "sh", "-c",
                                 f"echo '2 {BLIT_BYTES}' > {blitf}"])
        time.sleep(3)
        assert blit.poll() is None, "the blit ended before the kill: nothing was tested"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        assert blit.wait(600) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        if blit is not None and blit.poll() is None:
            blit.wait(600)
        ticker.terminate()
        ticker.communicate(timeout=60)
    assert blit_words_wrong(dev, ks) == []
    st = helper_status()
    assert st["armed_pages"] == 0 and st["filters"] == 0, st


def test_sigkill_leaves_a_readable_file_and_nothing_armed(held):
    """A recording killed in a loop: nothing stays armed, and report prints
    the whole records written before the kill (the file says it is cut short)."""
    exerciser = held
    hold("map")
    path = ARTIFACTS / "ng-record-kill.rec"
    proc = subprocess.Popen([*NG, "record", "--pci", exerciser.dev.name, "-o", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while held_pages()[2] and time.monotonic() < deadline:     # armed once ready
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    # a loop that lasts well past the kill (about 13 s traced)
    loop = subprocess.Popen(["sh", "-c", f"echo 'rloop 2000000' > {RUN}"])
    time.sleep(2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(60)
    loop.wait(300)
    assert_left_whole(exerciser)
    res = subprocess.run([*NG, "report", str(path)], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0 and "cut short" in res.stderr, res.stderr
    recs = to_records(res.stdout, exerciser.bar0[0])
    reads = [r for r in recs if r[0] == "R"]
    assert reads and set(reads) == {("R", 4, 0x00, 0x010000ED)}
    assert [r for r in recs if r[0] not in ("R", "MAP")] == []


def ivshmem_64m() -> PciDevice:
    """The 64 MiB ivshmem-plain device, bound to the exerciser (new_id), whose
    debugfs "map" maps one of its BARs and accesses it."""
    (dev,) = [d for d in find_pci_devices(*IVSHMEM) if d.bars[2][1] == 64 << 20]
    try:
        (EXERCISER_DRIVER / "new_id").write_text("1af4 1110\n")
    except OSError as exc:
        assert exc.errno == errno.EEXIST
    assert (Path("/sys/kernel/debug") / f"edu_exerciser-{dev.name}" / "map").exists()
    return dev


def test_bar_selection_traces_only_those_bars(exerciser):
    """ivshmem-plain has two memory BARs, 0 (256 bytes of registers) and 2
    (64 MiB): each mapped and accessed in turn, @0 shows only BAR 0's
    mapping and accesses, @2 only BAR 2's, the whole device both."""
    dev = ivshmem_64m()
    mapf = Path("/sys/kernel/debug") / f"edu_exerciser-{dev.name}" / "map"
    # (BAR 0's registers do not read back what is written: that write says EIO)
    cmd = ["sh", "-c", f"echo '0 ioremap' > {mapf}; echo '2 ioremap' > {mapf}"]
    seen: dict[str, set[int]] = {}
    for sel in ("@0", "@2", ""):
        path, res = record(["--pci", dev.name + sel], f"ng-record-bar{sel[1:] or 's'}", cmd)
        assert res.returncode == 0, res.stderr
        bars = []
        for line in report(path).splitlines():
            if line.startswith(("MAP ", "R ", "W ")):
                phys = int(line.split()[3 if line[0] == "M" else 4], 16)
                (hit,) = [i for i in (0, 2) if dev.bars[i][0] <= phys
                          < dev.bars[i][0] + dev.bars[i][1]]
                bars.append((line[0], hit))
        seen[sel] = set(bars)
    both = {(k, i) for k in "MRW" for i in (0, 2)}
    assert seen == {"@0": {(k, 0) for k in "MRW"}, "@2": {(k, 2) for k in "MRW"},
                    "": both}, seen


def test_bad_selections_exit_2_and_arm_nothing(exerciser):
    dev = exerciser.dev.name
    cases = [
        (["--pci", f"{dev}@3"], f"mmiotrace-ng: PCI device 0000:{dev.split(':', 1)[-1]} "
                                "has no memory BAR 3 (its memory BARs: 0)"),
        (["--pci", f"{dev}@x"], f"mmiotrace-ng: bad BAR list 'x' in '{dev}@x'"),
    ]
    for args, want in cases:
        path, res = record(args, "ng-record-bad", ["true"], timeout=300)
        assert res.returncode == 2 and res.stderr.startswith(want), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = subprocess.run([*NG, "record", "--pci", dev, "--", "true"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "-o/--output" in res.stderr, res.stderr
    ensure_helper()
    st = helper_status()
    assert st["armed_pages"] == 0 and st["filters"] == 0, st
