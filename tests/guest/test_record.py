"""record and report in the guest: a recording prints as the truth of each
scenario, keeps the traced machine's symbols, selects BARs, survives a
SIGKILL without leaving anything armed, and keeps a sustained loop whole."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from held import assert_left_whole, ensure_helper, held_pages, hold
from kernel_tracer import PciDevice, find_pci_devices, to_records
from ng_tracer import ARTIFACTS, NG, helper_status, recorded_for_host, sections
from test_ng_trace import COMPARED, count_for, decoded, erms

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


BLIT = 0xFF000      # the exerciser's largest memcpy_toio: 261120 movsl stores


def test_the_default_ring_keeps_a_blit_of_a_million_stores(exerciser):
    """Four framebuffer-style blits (memcpy_toio of 0xFF000 bytes, rep
    movsl: 1044480 stores) recorded with record's default ring, which holds
    fewer: nothing lost, every access recorded.  That each is in the file,
    in order, with its value, the host checks (tests/recorded/
    test_recording_blit.py: seconds there, minutes here)."""
    res = recorded_for_host("blit", [
        "record", "--pci", exerciser.dev.name, "-o", "{rec}", "--", "sh", "-c",
        "; ".join([f"echo 'cloop {BLIT}' > {RUN}"] * 4)],
        bdf=exerciser.dev.name, bar0=exerciser.bar0[0], blit=BLIT, erms=erms())
    m = re.search(r"^mmiotrace-ng: (\d+) records \(map (\d+), unmap (\d+), access (\d+), "
                  r"mark \d+\) recorded in .*, lost (\d+)$", res.stderr, re.M)
    assert m, res.stderr
    records, maps, unmaps, accesses, lost = map(int, m.groups())
    stores = sum(r[0] == "W" for r in decoded("cloop", BLIT))
    assert (records, maps, unmaps, accesses, lost) == (
        4 + 4 + 4 * stores, 4, 4, 4 * stores, 0), res.stderr


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
