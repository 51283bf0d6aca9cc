"""Large BARs: mappings made of 2 MiB pages are traced, with every ioremap
variant; one made of 1 GiB pages is said to be NOT traced (and works on).

The test guest has two QEMU ivshmem-plain devices, whose BAR2 is plain
memory (64 MiB and 1 GiB); the exerciser binds them through new_id and maps
BAR2 with the call asked for (its "map" file), writes a pattern at the
start, the middle and the end and reads it back.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from kernel_tracer import find_pci_devices, to_records
from ng_tracer import NgTracer, helper_status

IVSHMEM = (0x1AF4, 0x1110)
DRIVER = Path("/sys/bus/pci/drivers/edu_exerciser")
MiB, GiB = 1 << 20, 1 << 30
CALLS = ["ioremap", "ioremap_wc", "ioremap_uc", "ioremap_wt", "ioremap_cache", "pci_iomap_wc"]
LEVELS = {1: "4K", 2: "2M", 3: "1G"}
# the level the exerciser finds is 0 when the entry it looks at is cleared:
# a 2M (or 1G) entry the helper armed (an armed 4K entry still shows as 4K)
ARMED_HUGE = 0


@pytest.fixture(scope="module")
def ivshmem(exerciser):
    devs = find_pci_devices(*IVSHMEM)
    by_size = {d.bars[2][1]: d for d in devs}
    assert set(by_size) == {64 * MiB, GiB}, [d.bars for d in devs]
    try:
        (DRIVER / "new_id").write_text("1af4 1110\n")
    except OSError as exc:
        assert exc.errno == errno.EEXIST
    for d in devs:
        assert (Path("/sys/kernel/debug") / f"edu_exerciser-{d.name}" / "map").exists()
    return by_size


def do_map(dev, call: str) -> int:
    """Map BAR2 with call, access it; the page-table level it had."""
    d = Path("/sys/kernel/debug") / f"edu_exerciser-{dev.name}"
    (d / "map").write_text(f"2 {call}\n")
    return int((d / "level").read_text())


def expected(size: int) -> list[tuple]:
    out: list[tuple] = [("MAP", 0, size)]
    for i, off in enumerate((0, (size // 2) & ~7, size - 8)):
        v = 0x5A000000 | (i << 16) | ((off >> 12) & 0xFFFF)
        out += [("W", 4, off, v), ("R", 4, off, v)]
    return [*out, ("UNMAP",)]


@pytest.mark.parametrize("call", CALLS)
def test_64mib_bar_is_traced(ivshmem, call):
    dev = ivshmem[64 * MiB]
    start = dev.bars[2][0]
    assert do_map(dev, call) == 2, "untraced, the kernel maps this BAR with 2M pages"
    t = NgTracer(["--pci", dev.name], f"ng-ivshmem-{call}").start()
    try:
        level = []
        text = t.section(lambda: level.append(do_map(dev, call)))
    finally:
        assert t.stop() == 0
    assert level == [ARMED_HUGE], level          # armed at the 2M level
    assert to_records(text, start) == expected(64 * MiB), text
    st = helper_status()
    assert st["armed_pages"] == 0, st


def test_1gib_bar_in_1gib_pages_is_said_not_traced(ivshmem):
    dev = ivshmem[GiB]
    start = dev.bars[2][0]
    t = NgTracer(["--pci", dev.name], "ng-ivshmem-1g").start()
    try:
        level = []
        text = t.section(lambda: level.append(do_map(dev, "ioremap")))
    finally:
        assert t.stop() == 0
    recs = to_records(text, start)
    # QEMU's "max" CPU has pdpe1gb, and the BAR is 1 GiB aligned: the
    # kernel maps it with one 1G entry
    assert level == [3], (f"the 1 GiB BAR was mapped with {LEVELS.get(level[0], level[0])} "
                          "pages: the test needs a CPU with 1G pages (pdpe1gb)")
    marks = [ln for ln in text.splitlines() if "NOT traced" in ln]
    assert len(marks) == 1 and marks[0].endswith("which the helper does not arm"), text
    assert not [r for r in recs if r[0] in ("R", "W", "MAP")], recs
