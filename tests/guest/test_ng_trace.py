"""mmiotrace-ng against the kernel's own mmiotrace, in the same boot.

For every exerciser scenario the kernel's tracer runs first (it offlines a
CPU, so it cannot run at the same time), then one mmiotrace-ng session
traces all scenarios, each between two trace_marker lines, and shows the
decoded accesses in its live default-mode text.  The session ends with the
SMP stress test and a SIGKILL during a burst; then a --compat session
traces every scenario again, and its live text must equal the kernel's
once timestamps, virtual addresses and map ids are normalized; `render
--compat` of its --raw file must give the same bytes.  The tests of this
file run in order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import memset_bytewise
from held import assert_left_whole, ensure_helper, held_pages, hold
from kernel_tracer import (
    assert_same,
    between,
    capture,
    device_stream,
    find_pci_device,
    map_id_problems,
    normalize,
    prepared_e1000_load,
    repeated_reads,
    to_records,
)
from ng_tracer import MARKER, NG, NgTracer, helper_status

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drivers" / "edu_exerciser"))
import scenarios as sc  # noqa: E402

LOOP_COUNT = 10
# cloop's bytes: 777 movsl stores in one rep movsl, more than three of the
# helper's chunks at any rep_chunk up to 256 (it emulates at most that
# many elements per fault), then both tails
CLOOP_BYTES = 4 * 777 + 3
SMP_N = 100_000
CPU_ONLINE = Path("/sys/devices/system/cpu/online")
# The burst needs two CPUs, which the kernel's tracer does not leave online.
COMPARED = [n for n in sc.NAMES if n != "burst"]


def count_for(name: str) -> int | None:
    if name == "cloop":
        return CLOOP_BYTES
    return LOOP_COUNT if name in sc.COUNTED else None


def erms() -> bool:
    """memset_io() is byte stores (what scenarios.expected calls erms)."""
    return memset_bytewise()


def decoded(name: str, count: int | None) -> list[tuple]:
    """What the default mode prints: the string instructions decoded."""
    return sc.decoded(name, count, erms=erms())


def records_only(text: str) -> list[str]:
    """Normalized record lines, without the VERSION/PCIDEV header."""
    return [ln for ln in normalize(text) if not ln.startswith(("VERSION", "PCIDEV"))]


@pytest.fixture(scope="module")
def edu(exerciser):
    return exerciser


@pytest.fixture(scope="module")
def kernel_refs(edu):
    """The kernel tracer's stream for every compared scenario."""
    refs = {}
    for name in COMPARED:
        refs[name] = capture(lambda name=name: edu.run(name, count_for(name)), until="UNMAP")
    return refs


@pytest.fixture(scope="module")
def ng(edu, kernel_refs):
    online = CPU_ONLINE.read_text()
    t = NgTracer(["--pci", edu.dev.name], "ng-edu").start()
    t.online_before = online
    yield t
    t.stop(signal.SIGKILL)


@pytest.mark.parametrize("name", COMPARED)
def test_scenario_matches_truth(name, edu, ng):
    """The live default-mode text of each scenario: the documented sequence,
    with what the kernel's tracer cannot decode decoded."""
    count = count_for(name)
    text = ng.section(lambda: edu.run(name, count))
    assert to_records(text, edu.bar0[0]) == decoded(name, count)
    assert CPU_ONLINE.read_text() == ng.online_before


REP_CHUNK = Path("/sys/module/mmiotng/parameters/rep_chunk")


@pytest.mark.parametrize(("chunk", "used"), [(0, 1), (5, 5), (1_000_000, 4096)])
def test_rep_chunk_bounds_the_elements_per_fault(edu, ng, chunk, used):
    """cloop's rep movsl of 777 stores takes one fault per rep_chunk
    elements (the parameter clamped to 1..4096), and a fault each for the
    movsw and movsb tails; its records are the same whatever the chunk."""
    stores = CLOOP_BYTES // 4
    before = REP_CHUNK.read_text()
    REP_CHUNK.write_text(f"{chunk}\n")
    try:
        faults = helper_status()["faults"]
        text = ng.section(lambda: edu.run("cloop", CLOOP_BYTES))
        faults = helper_status()["faults"] - faults
    finally:
        REP_CHUNK.write_text(before)
    assert to_records(text, edu.bar0[0]) == decoded("cloop", CLOOP_BYTES)
    assert faults == -(-stores // used) + 2


def test_header_matches_kernel(kernel_refs, ng):
    """VERSION and PCIDEV lines, byte for byte."""
    kernel = kernel_refs["readl"]
    head = [ln for ln in kernel.splitlines(keepends=True)
            if ln.startswith(("VERSION", "PCIDEV"))]
    ours = [ln for ln in ng.text().splitlines(keepends=True)
            if ln.startswith(("VERSION", "PCIDEV"))]
    assert head and ours == head


def test_marker_appears(ng):
    text = ng.section(lambda: subprocess.run([*NG, "mark", "X is up"], check=True))
    assert text.splitlines()[-1].split(" ", 2)[2] == "X is up"
    Path("/sys/kernel/tracing/trace_marker").write_text("plain echo\n")
    ng.wait_for(" plain echo\n")


def test_second_instance_refused(edu, ng):
    res = subprocess.run([*NG, "--pci", edu.dev.name, "--", "true"],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert "another mmiotrace-ng" in res.stderr and "Traceback" not in res.stderr


def test_kernel_tracer_refused_while_tracing(ng, dmesg_clean):
    res = subprocess.run(["sh", "-c", "echo mmiotrace > /sys/kernel/tracing/current_tracer"],
                         capture_output=True, text=True)
    assert res.returncode != 0, "the kernel's tracer started while mmiotrace-ng runs"
    log = dmesg_clean.all_lines()       # this test's window of the kernel log only
    assert any("refusing the kernel's mmiotrace: an mmiotrace-ng session is active" in ln
               for ln in log), log
    assert Path("/sys/kernel/tracing/current_tracer").read_text().strip() == "nop"
    assert CPU_ONLINE.read_text() == ng.online_before


def test_smp_stress(edu, ng):
    """Two CPUs read the same armed page at once: every access recorded, correct."""
    before = helper_status()
    text = ng.section(lambda: edu.run("burst", SMP_N))
    after = helper_status()
    recs = to_records(text, edu.bar0[0])
    assert recs[0] == sc.MAP() and recs[-1] == ("UNMAP",)
    body = recs[1:-1]
    assert len(body) == 2 * SMP_N
    assert set(body) == {sc.R(4, 0x00, sc.IDENT)}
    assert edu.mismatches() == 0
    assert after["emulated"] - before["emulated"] == 2 * SMP_N
    assert "Lost" not in text
    assert CPU_ONLINE.read_text() == ng.online_before


def test_sigkill_during_burst_leaves_nothing_armed(edu, ng):
    errors: list[BaseException] = []
    n = 100 * SMP_N     # still running when the first record is seen (6.17 finished 20x first)

    def burst():
        try:
            edu.run("burst", n)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    hold("map")                 # mapped while tracing: armed from its MAP on
    try:
        assert held_pages()[2] == 0, "the held mapping is not armed"
        th = threading.Thread(target=burst)
        th.start()
        try:
            ng.wait_for("R 4 ", timeout=120)    # the burst is being traced
            alive = th.is_alive()
        finally:
            ng.stop(signal.SIGKILL)
        th.join(600)
        assert alive, "the burst ended before the kill: make it longer"
        assert not errors
        st = helper_status()
        assert st["armed_pages"] == 0 and st["mappings"] == 0 and st["filters"] == 0
        assert st["owner"] == 0
        edu.run("burst", 1000)
        assert edu.mismatches() == 0
        assert_left_whole(edu)      # the page table whole, the driver works untraced
    finally:
        hold("unmap")
        ensure_helper()


@pytest.fixture(scope="module")
def ng_compat(edu, kernel_refs, ng):
    """A --compat run, once the default-mode run is over."""
    ng.stop(signal.SIGKILL)
    t = NgTracer(["--pci", edu.dev.name, "--compat"], "ng-edu-compat").start()
    t.online_before = CPU_ONLINE.read_text()
    yield t
    t.stop(signal.SIGKILL)


@pytest.mark.parametrize("name", COMPARED)
def test_scenario_compat_matches_kernel(name, edu, kernel_refs, ng_compat):
    """The live --compat text of each scenario: the kernel's tracer's records
    on the same workload in the same boot, and the documented sequence."""
    count = count_for(name)
    base = edu.bar0[0]
    text = ng_compat.section(lambda: edu.run(name, count))
    kernel = kernel_refs[name]
    assert to_records(text, base) == sc.expected(name, count, erms=erms())
    if name in sc.KERNEL_DEVIATIONS:
        # the kernel's tracer misses what mmiotrace-ng sees: check the kernel's view
        assert to_records(kernel, base) == sc.expected(name, count, kernel=True, erms=erms())
    else:
        assert records_only(text) == records_only(kernel)
    assert map_id_problems(text) == [] and map_id_problems(kernel) == []
    assert CPU_ONLINE.read_text() == ng_compat.online_before


def test_render_of_raw_is_the_live_text(ng_compat):
    """`mmiotrace-ng render --compat` of the --raw file of the --compat run
    prints the bytes that run printed."""
    assert ng_compat.stop() == 0, ng_compat.stderr()
    res = subprocess.run([*NG, "render", "--compat", str(ng_compat.raw)], capture_output=True)
    assert res.returncode == 0, res.stderr
    live = ng_compat.out.read_bytes()
    assert live.count(b"\nR ") > 20 and res.stdout == live


def test_lost_events_are_counted(edu, exerciser):
    """A tiny buffer and a burst: emitted + lost == performed, exactly."""
    n = 20_000
    t = NgTracer(["--pci", edu.dev.name, "--buffer-size-kb", "4"], "ng-lost").start()
    try:
        edu.run("rloop", n)
    finally:
        assert t.stop() == 0
    recs = to_records(t.text(), edu.bar0[0])
    reads = sum(1 for r in recs if r == sc.R(4, 0x00, sc.IDENT))
    maps = sum(1 for r in recs if r[0] in ("MAP", "UNMAP"))
    lost = sum(r[1] for r in recs if r[0] == "LOST")
    assert lost > 0, "the 4 KiB buffer should have overflowed"
    assert len(recs) == reads + maps + sum(r[0] == "LOST" for r in recs), "other records"
    assert reads + maps + lost == n + 2, (reads, maps, lost)
    assert f"lost {lost}" in t.stderr()



def test_reading_resumes_after_overflow(edu, exerciser):
    """Overflow the buffer again and again.  Records made while it is full are
    lost (and counted), markers included; once a marker gets through again,
    the tracer has caught up, and the quiet section that follows is complete.
    All rounds add up exactly.

    The test runs on one CPU: a loss is carried by the next record of the
    CPU that lost it, so the sync markers must come from the CPU the loop
    ran on, or a loss of that CPU shows up later, in the quiet section."""
    n, rounds, syncs = 20_000, 4, 0
    t = NgTracer(["--pci", edu.dev.name, "--buffer-size-kb", "64"], "ng-resume").start()
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        for i in range(rounds):
            edu.run("rloop", n)
            deadline, k = time.monotonic() + 60, 0
            while f"ng-sync-{i}-" not in t.text():
                assert time.monotonic() < deadline, "the tracer never caught up"
                MARKER.write_text(f"ng-sync-{i}-{k}\n")
                k += 1
                syncs += 1
                time.sleep(0.2)
            quiet = to_records(t.section(lambda: edu.run("readl")), edu.bar0[0])
            assert quiet == sc.expected("readl"), quiet
    finally:
        os.sched_setaffinity(0, cpus)
        assert t.stop() == 0
    recs = to_records(t.text(), edu.bar0[0])
    lost = sum(r[1] for r in recs if r[0] == "LOST")
    traced = sum(1 for r in recs if r[0] in ("MAP", "UNMAP", "R"))
    marks = sum(1 for r in to_records(t.text(), with_marks=True) if r[0] == "MARK")
    assert lost > 0, "the 64 KiB buffer should have overflowed"
    assert len(recs) == traced + sum(r[0] == "LOST" for r in recs), "other records"
    made = rounds * (len(sc.expected("rloop", n)) + len(sc.expected("readl")) + 2) + syncs
    assert traced + marks + lost == made, (traced, marks, lost, made)


E1000_ID = (0x8086, 0x100E)


def test_e1000_matches_kernel():
    """modprobe e1000 under both tracers: the same records in the same order.

    Both traced loads come after the same preparation: a load and unload (the
    first load after boot reads other values), then 2 s for the link state
    the unload left to settle, so that both find the device alike."""
    dev = find_pci_device(*E1000_ID)
    assert dev is not None, "boot the VM with --qemu '-device e1000,...'"
    subprocess.run(["rmmod", "e1000"], capture_output=True)

    def prepared_load() -> None:
        prepared_e1000_load("e1000-load", "e1000-loaded")

    kernel = capture(prepared_load, until=lambda text: "e1000-loaded" in text,
                     quiet=2.0, timeout=300)
    subprocess.run(["rmmod", "e1000"], check=True)
    t = NgTracer(["--pci", dev.name, "--compat"], "ng-e1000").start()
    try:
        prepared_load()
        ours = t.wait_for("e1000-loaded")
    finally:
        assert t.stop() == 0, t.stderr()
    subprocess.run(["rmmod", "e1000"], check=True)
    kernel = between(kernel, "e1000-load", "e1000-loaded")
    ours = between(ours, "e1000-load", "e1000-loaded")

    bars = [b for b in dev.bars if b[1]]
    k, o = device_stream(kernel, bars), device_stream(ours, bars)
    print(f"{len(k)} records; R {sum(r[0] == 'R' for r in k)}, W {sum(r[0] == 'W' for r in k)}")
    assert sum(r[0] == "R" for r in k) > 500 and sum(r[0] == "W" for r in k) > 3000
    assert [r for r in k if r[0] in ("MAP", "UNMAP")], "no mapping of the NIC in the window"
    assert not [r for r in o if r[0] in ("LOST", "?")], [r for r in o if r[0] in ("LOST", "?")]
    assert_same(o, k)
    # repeated reads count one by one: the load has some (the same register
    # read twice in a row from one place), and without one of them the
    # comparison above fails
    dups = repeated_reads(o)
    print(f"{len(dups)} reads repeat the one before, e.g. {[o[i] for i in dups[:3]]}")
    assert dups and o[: dups[0]] + o[dups[0] + 1 :] != k
