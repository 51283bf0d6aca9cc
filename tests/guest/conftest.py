"""Fixtures for the tests that run inside the test VM (tests/vm/run).

- Every test here is skipped unless NGVM_GUEST=1 (set by the VM's init).
- ``dmesg_clean`` (autouse): fails the test if the kernel log gained a line
  matching Oops|BUG|WARNING|general protection|Call Trace while it ran; a
  test marked ``oops`` (it makes the kernel oops on purpose, and runs after
  every other test of its session) may gain the lines of one page-fault
  oops report, nothing else.
- Tests marked ``lockdown_boot`` run in a boot with module.sig_enforce=1
  on the kernel's command line, those marked ``integrity_boot`` in one with
  lockdown=integrity, and no other test runs there (deselected).
- Tests marked ``single_tcg`` fail at once in a guest that runs under
  QEMU's multi-threaded TCG (NGVM_ACCEL=tcg-multi): they patch kernel code
  that another vCPU executes in a loop, which that mode does not handle
  (tests/run runs them in a second guest booted with --accel tcg-single).
- ``--shard K/N``: only the K-th of N parts of the tests, split by file
  (shards.py): tests/run runs the main boot's tests in two guests side by
  side.
- ``exerciser`` (session): loads tests/drivers/edu_exerciser/edu_exerciser.ko,
  which must have been built on the host, and unloads it at the end;
  ``exerciser.run(name, count)`` runs one scenario.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import shards
from kernel_tracer import PciDevice, find_pci_device

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXERCISER_DIR = REPO / "tests" / "drivers" / "edu_exerciser"
EXERCISER_KO = EXERCISER_DIR / "edu_exerciser.ko"
EXERCISER_DEBUGFS = Path("/sys/kernel/debug/edu_exerciser")
EDU_ID = (0x1234, 0x11E8)

IN_GUEST = os.environ.get("NGVM_GUEST") == "1"
BAD_KERNEL_LOG = re.compile(r"Oops|BUG|WARNING|general protection|Call Trace")
# How long the race and kill loops run: their lengths in tests/run keep the
# suite within 20 minutes under TCG; NG_STRESS_SCALE=10 in the guest's
# environment runs each ten times as long (a soak before a release).
STRESS_SCALE = float(os.environ.get("NG_STRESS_SCALE", "1"))


def stress_length(amount: float) -> float:
    """A loop's length (seconds or cycles) scaled by NG_STRESS_SCALE."""
    return amount * STRESS_SCALE


def pytest_addoption(parser):
    parser.addoption("--shard", default="1/1", metavar="K/N",
                     help="run the K-th of N parts of the tests, split by file "
                          "(tests/guest/shards.py; tests/run runs two side by side)")


def _deselect(config, items, drop) -> None:
    if drop:
        config.hook.pytest_deselected(items=drop)
        dropped = set(map(id, drop))
        items[:] = [item for item in items if id(item) not in dropped]


def pytest_collection_modifyitems(config, items):
    try:
        k, n = shards.parse(config.getoption("--shard"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    if n > 1:
        part = shards.assign([Path(item.path).name for item in items], n)
        _deselect(config, items, [item for item in items if part[Path(item.path).name] != k])
    if IN_GUEST:
        # the boots that enforce module signatures (module.sig_enforce=1,
        # lockdown=integrity) and the flight recorder's (ngvm.flight=1, which
        # dies on purpose: tests/guest/flight_boot.py) run their tests and no other
        cmdline = Path("/proc/cmdline").read_text().split()
        boot = ("lockdown_boot" if "module.sig_enforce=1" in cmdline else
                "integrity_boot" if "lockdown=integrity" in cmdline else
                "flight_boot" if "ngvm.flight=1" in cmdline else None)
        _deselect(config, items, [item for item in items
                                  if any((item.get_closest_marker(m) is not None) != (m == boot)
                                         for m in ("lockdown_boot", "integrity_boot",
                                                   "flight_boot"))])
        # the kernel is tainted after an oops: those tests come last
        items.sort(key=lambda item: item.get_closest_marker("oops") is not None)
        return
    skip = pytest.mark.skip(
        reason="guest-only test: NGVM_GUEST=1 is not set; run it inside the test VM, "
               "e.g. tests/vm/run --qemu '-device edu' -- python -m pytest tests/guest")
    for item in items:
        if HERE == Path(item.path).parent or HERE in Path(item.path).parents:
            item.add_marker(skip)


# ksym's BPF object, compiled ahead in the background once the session
# knows it has ksym tests (40 s or more of one test under TCG otherwise):
# the product's own compile path (common/bpfload.py), on the vCPU the
# tests leave idle most of the time, into the cache the tests then load.
_KSYM_PREFETCH = ("from mmiotrace_ng.common.bpfload import compiled, source_dir\n"
                  "from mmiotrace_ng.ksym.probes import PROGRAMS\n"
                  "compiled(source_dir('bpf') / 'ksym.bpf.c', PROGRAMS)\n")
_prefetch: subprocess.Popen | None = None


def pytest_collection_finish(session):
    global _prefetch
    if IN_GUEST and any(Path(item.path).name == "test_ksym.py" for item in session.items):
        _prefetch = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", _KSYM_PREFETCH],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=REPO)


def pytest_sessionfinish(session):
    if _prefetch is not None and _prefetch.poll() is None:
        _prefetch.kill()
        _prefetch.wait()


def pytest_runtest_setup(item):
    if item.get_closest_marker("single_tcg") and os.environ.get("NGVM_ACCEL") == "tcg-multi":
        pytest.fail("this test needs a guest with single-threaded TCG: QEMU's multi-threaded "
                    "TCG misses code patched on one vCPU while another runs it "
                    "(tests/vm/run --accel tcg-single ... -m single_tcg)", pytrace=False)


LOST_LOG_RECORDS = "[kernel log records were lost]"


class KernelLog:
    """New /dev/kmsg records since construction (nothing older), read as
    they come by a thread, so that a test that logs a lot does not see its
    oldest records overwritten first.  Records lost all the same (the
    buffer wrapped between two reads) leave LOST_LOG_RECORDS, which fails
    the test: what they said cannot be checked."""

    def __init__(self) -> None:
        self._fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self._fd, 0, os.SEEK_END)
        self._seen: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._follow, daemon=True)
        self._reader.start()

    def _follow(self) -> None:
        while not self._stop.wait(0.2):
            self.new_lines()

    def all_lines(self) -> list[str]:
        """Every record since construction, whoever read them before."""
        self.new_lines()
        with self._lock:
            return list(self._seen)

    def new_lines(self) -> list[str]:
        """The records read by this call (the thread reads too: callers
        want all_lines)."""
        lines: list[str] = []
        with self._lock:
            while True:
                try:
                    rec = os.read(self._fd, 16384)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:   # overwritten records: go on
                        lines.append(LOST_LOG_RECORDS)
                        continue
                    raise
                if not rec:
                    break
                _head, _, msg = rec.decode(errors="replace").partition(";")
                # Continuation lines (" KEY=value") are metadata; keep the text.
                lines.extend(m for m in msg.split("\n") if m and not m.startswith(" "))
            self._seen.extend(lines)
        return lines

    def close(self) -> None:
        self._stop.set()
        self._reader.join()
        os.close(self._fd)


def bad_log_lines(lines: list[str]) -> list[str]:
    """The lines that fail a test: BAD_KERNEL_LOG's, and the mark of records
    that were lost before they could be read."""
    return [line for line in lines if BAD_KERNEL_LOG.search(line) or line == LOST_LOG_RECORDS]


# the lines of one oops report on a page fault that match BAD_KERNEL_LOG
ONE_OOPS_LINES = re.compile(r"BUG: unable to handle page fault for address|Oops: |Call Trace")


def one_oops_or_nothing(bad: list[str]) -> list[str]:
    """Of an oops test's lines matching BAD_KERNEL_LOG, those that are not
    part of one page-fault oops report (all of them if there are two)."""
    if sum(line.startswith("Oops: ") or " Oops: " in line for line in bad) > 1:
        return bad
    return [line for line in bad if not ONE_OOPS_LINES.search(line)]


@pytest.fixture(autouse=True)
def dmesg_clean(request):
    log = KernelLog()
    try:
        yield log
        bad = bad_log_lines(log.all_lines())
        if request.node.get_closest_marker("oops"):
            bad = one_oops_or_nothing(bad)
    finally:
        log.close()
    if bad:
        pytest.fail("the kernel log gained lines matching "
                    f"{BAD_KERNEL_LOG.pattern!r} during the test:\n" + "\n".join(bad),
                    pytrace=False)


class Exerciser:
    """The loaded edu_exerciser module and its edu device."""

    def __init__(self, dev: PciDevice):
        self.dev = dev
        self.bar0 = dev.bars[0]          # (start, length)

    def run(self, name: str, count: int | None = None) -> None:
        """Run one scenario; returns when it has finished.  Raises OSError
        with the module's errno (EINVAL, EIO, ...) when the write fails."""
        line = name if count is None else f"{name} {count}"
        fd = os.open(EXERCISER_DEBUGFS / "run", os.O_WRONLY)
        try:
            written = os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        assert written == len(line) + 1, f"short write {written} for {line!r}"

    def scenarios(self) -> list[str]:
        """Scenario names as the module lists them."""
        text = (EXERCISER_DEBUGFS / "run").read_text()
        return [line.split()[0] for line in text.splitlines() if line.strip()]

    def mismatches(self) -> int:
        return int((EXERCISER_DEBUGFS / "mismatches").read_text())

    def burst_cpus(self) -> tuple[int, int]:
        a, b = (EXERCISER_DEBUGFS / "burst_cpus").read_text().split()
        return int(a), int(b)


@functools.cache
def memset_bytewise() -> bool:
    """Whether memset_io() is byte stores on this kernel and CPU (rep stosb:
    6.1 with ERMS) rather than 8-byte ones (6.12 without FSRS): the
    exerciser's "memset" (run once, untraced) tells from what edu kept.
    Needs the exerciser loaded (the exerciser fixture)."""
    fd = os.open(EXERCISER_DEBUGFS / "run", os.O_WRONLY)
    try:
        os.write(fd, b"memset\n")
    finally:
        os.close(fd)
    return (EXERCISER_DEBUGFS / "memset_bytes").read_text().strip() == "1"


def _rmmod(name: str) -> None:
    if Path("/sys/module", name).exists():
        subprocess.run(["rmmod", name], check=True, capture_output=True, text=True)


@pytest.fixture(scope="session")
def exerciser():
    if not EXERCISER_KO.exists():
        pytest.fail(f"{EXERCISER_KO} is missing: build it on the host before booting the VM: "
                    f"make -C /lib/modules/$(uname -r)/build M={EXERCISER_DIR} modules",
                    pytrace=False)
    dev = find_pci_device(*EDU_ID)
    if dev is None:
        pytest.fail("no edu PCI device (1234:11e8): boot the VM with --qemu '-device edu'",
                    pytrace=False)
    _rmmod("edu_exerciser")
    res = subprocess.run(["insmod", str(EXERCISER_KO)], check=False,
                         capture_output=True, text=True)
    if res.returncode:
        pytest.fail(f"insmod {EXERCISER_KO} failed: {res.stderr.strip()}", pytrace=False)
    try:
        if not (EXERCISER_DEBUGFS / "run").exists():
            pytest.fail(f"edu_exerciser loaded but {EXERCISER_DEBUGFS}/run is missing "
                        f"(did it bind to {dev.name}?)", pytrace=False)
        yield Exerciser(dev)
    finally:
        _rmmod("edu_exerciser")


@pytest.fixture
def held(exerciser):
    """The exerciser, with its held mapping unmapped and the helper loaded
    after the test (see held.py)."""
    from held import ensure_helper, hold

    ensure_helper()
    yield exerciser
    try:
        hold("unmap")
    except OSError:
        pass
    ensure_helper()
