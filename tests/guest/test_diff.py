"""mmiotrace-ng diff on real recordings, in the guest: two runs of the same
exerciser scenarios are equal; one changed write gives exactly that hunk;
two loads of e1000, in one boot and in two, are equal once the
descriptor-base registers (DMA addresses the driver allocates anew) are
ignored; the kernel tracer's text compares with a recording."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from kernel_tracer import capture, find_pci_device
from ng_tracer import ARTIFACTS, NG

from mmiotrace_ng.format.rawfile import open_recording

RUN = Path("/sys/kernel/debug/edu_exerciser/run")
E1000_ID = (0x8086, 0x100E)
# e1000 registers that hold DMA addresses (RDBAL/RDBAH, TDBAL/TDBAH)
DESCRIPTOR_BASES = "0x2800,0x2804,0x3800,0x3804"
FIRST_BOOT_E1000 = "ng-diff-e1000-1"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def recorded(args: list[str], name: str, cmd: list[str]) -> Path:
    path = ARTIFACTS / f"{name}.rec"
    ARTIFACTS.mkdir(exist_ok=True)
    res = subprocess.run([*NG, "record", *args, "-o", str(path), "--", *cmd],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return path


def diff(*argv: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([*NG, "diff", *map(str, argv)], capture_output=True, text=True,
                          timeout=600)


def scenarios(value: int) -> list[str]:
    steps = ["readl", "rmw", f"wval {value}", "writel", "wloop 50", "readl"]
    return ["sh", "-c", "; ".join(f"echo '{s}' > {RUN}" for s in steps)]


def changed_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines()
            if ln[:1] in "+-" and not ln.startswith(("---", "+++"))]


def test_two_runs_are_equal_one_changed_write_is_one_hunk(exerciser):
    a = recorded(["--pci", exerciser.dev.name], "ng-diff-a", scenarios(5))
    b = recorded(["--pci", exerciser.dev.name], "ng-diff-b", scenarios(5))
    c = recorded(["--pci", exerciser.dev.name], "ng-diff-c", scenarios(6))
    same = diff("--exact-counts", a, b)
    assert (same.returncode, same.stdout, same.stderr) == (0, "", "")
    other = diff(a, c)
    assert other.returncode == 1, other.stderr
    assert other.stdout.count("\n@@ ") + other.stdout.startswith("@@ ") == 1, other.stdout
    src = exerciser.bar0[0] + 0x80
    assert changed_lines(other.stdout) == [f"-W 4 {src:#x} 0x5", f"+W 4 {src:#x} 0x6"], \
        other.stdout
    # the text of a recording compares as the recording does
    text = ARTIFACTS / "ng-diff-a.txt"
    text.write_text(subprocess.run([*NG, "report", str(a)], capture_output=True, text=True,
                                   check=True).stdout)
    assert diff(text, b).returncode == 0


def test_a_poll_one_read_longer_differs_only_with_exact_counts(exerciser):
    """rloop 300 and rloop 301: the same by default (a poll's length
    folded), one hunk with --exact-counts, whose two lines carry the
    counts."""
    runs = [recorded(["--pci", exerciser.dev.name], f"ng-diff-rloop{n}",
                     ["sh", "-c", f"echo 'rloop {n}' > {RUN}"]) for n in (300, 301)]
    assert diff(*runs).returncode == 0
    exact = diff("--exact-counts", *runs)
    assert exact.returncode == 1, exact.stderr
    ident = exerciser.bar0[0]
    assert changed_lines(exact.stdout) == [f"-R 4 {ident:#x} 0x10000ed (x300)",
                                           f"+R 4 {ident:#x} 0x10000ed (x301)"], exact.stdout


def e1000_loads(names: list[str]) -> list[Path]:
    """A recording of a load and unload of e1000 for each name, after a first
    load and unload (the first load after boot reads other values)."""
    dev = find_pci_device(*E1000_ID)
    assert dev is not None, "boot the VM with --qemu '-device e1000,...'"
    subprocess.run(["rmmod", "e1000"], capture_output=True)
    subprocess.run(["modprobe", "e1000"], check=True)
    subprocess.run(["rmmod", "e1000"], check=True)
    return [recorded(["--pci", dev.name], name,
                     ["sh", "-c", "sleep 2; modprobe e1000; sleep 1; rmmod e1000"])
            for name in names]


def test_two_loads_of_e1000_are_equal_but_for_descriptor_bases():
    """(The first recording is also what the second boot compares with.)"""
    dev = find_pci_device(*E1000_ID)
    loads = e1000_loads([FIRST_BOOT_E1000, "ng-diff-e1000-2"])
    # e1000 came and went during each recording: its symbols are in anyway
    syms = open_recording(str(loads[0])).kallsyms
    assert "e1000_probe\t[e1000]" in syms, "e1000's symbols missing from the recording"
    res = diff("--exact-counts", "--ignore-value", DESCRIPTOR_BASES, *loads)
    assert (res.returncode, res.stderr) == (0, ""), res.stdout[:4000]
    plain = diff(*loads)
    print(f"without --ignore-value: exit {plain.returncode}\n{plain.stdout[:2000]}")
    assert plain.returncode in (0, 1), plain.stderr
    assert set(changed_lines(plain.stdout)) <= {
        ln for ln in changed_lines(plain.stdout)
        if int(ln.split()[2], 16) - dev.bars[0][0] in (0x2800, 0x2804, 0x3800, 0x3804)}


def test_the_kernel_tracers_text_compares_with_a_recording(exerciser):
    """The same scenarios under the kernel's mmiotrace (its trace_pipe text)
    and recorded by mmiotrace-ng, in the same boot: diff --compat (the
    recording read as the kernel's decoder would) finds them equal."""
    steps = scenarios(5)
    unmaps = len(steps[2].split(";"))
    kernel = capture(lambda: subprocess.run(steps, check=True),
                     until=lambda text: text.count("\nUNMAP ") >= unmaps, quiet=2.0,
                     timeout=300)
    text = ARTIFACTS / "kernel-diff.txt"
    text.write_text(kernel)
    ours = recorded(["--pci", exerciser.dev.name], "ng-diff-k", steps)
    res = diff("--compat", "--exact-counts", text, ours)
    assert (res.returncode, res.stderr) == (0, ""), res.stdout[:4000]
    other = recorded(["--pci", exerciser.dev.name], "ng-diff-k6", scenarios(6))
    assert diff("--compat", text, other).returncode == 1


@pytest.mark.second_boot
def test_e1000_in_another_boot_equals_the_first():
    """In tests/run's second guest, another boot of the same machine: a load
    of e1000 recorded here equals the first boot's (recorded by
    test_two_loads_of_e1000_are_equal_but_for_descriptor_bases), the
    descriptor-base registers and the header ignored."""
    first = ARTIFACTS / f"{FIRST_BOOT_E1000}.rec"
    assert first.exists(), f"{first} is missing: the first guest's e1000 test makes it"
    rec = open_recording(str(first))
    assert rec.meta["boot_id"] != BOOT_ID.read_text().strip(), f"{first} is of this boot"
    assert time.time() - rec.meta["started"] < 3 * 3600, f"{first} is stale"
    ids = f"{E1000_ID[0]:04x}{E1000_ID[1]:04x}"
    (pcidev,) = [ln.split() for ln in rec.header.splitlines()
                 if ln.startswith("PCIDEV ") and ln.split()[2] == ids]
    bar0 = int(pcidev[4], 16) & ~0xF
    dev = find_pci_device(*E1000_ID)
    if dev.bars[0][0] != bar0:
        # the first boot's hot-plug test (test_all.py) removed the NIC and
        # rescanned the bus, which gave it other addresses: the same here
        Path(f"/sys/bus/pci/devices/{dev.name}/remove").write_text("1")
        Path("/sys/bus/pci/rescan").write_text("1")
        dev = find_pci_device(*E1000_ID)
    assert dev.bars[0][0] == bar0, f"e1000's BAR 0 is at {dev.bars[0][0]:#x}, not {bar0:#x}"
    (this,) = e1000_loads(["ng-diff-e1000-boot2"])
    # the PCIDEV lines say what differs between the boots and is no traffic:
    # interrupt lines, drivers bound (the exerciser, in the first)
    res = diff("--ignore-header", "--ignore-value", DESCRIPTOR_BASES, first, this)
    assert (res.returncode, res.stderr) == (0, ""), res.stdout[:4000]
