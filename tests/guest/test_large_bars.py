"""Large BARs: mappings made of 4 KiB, 2 MiB and 1 GiB pages are traced,
with every ioremap variant, in BARs of 64 MiB, 1 GiB and 8 GiB (past 4 GiB
of physical range); a new mapping of more 4 KiB pages than the helper keeps
ready is said to be NOT traced (and works on); a huge BAR's ready mappings
take a bounded amount of memory.

The test guest has three QEMU ivshmem-plain devices, whose BAR2 is plain
memory (64 MiB, 1 GiB and 8 GiB, sparse memfd backends); the exerciser binds
them through new_id and maps BAR2, or a window of it, with the call asked
for (its "map" file), writes a pattern at the window's start, middle and end
and reads it back (-EIO if a value read is not the one written).
"""

from __future__ import annotations

import errno
import mmap
import struct
from pathlib import Path

import pytest
from kernel_tracer import find_pci_devices, to_records
from ng_tracer import NgTracer, helper_status

IVSHMEM = (0x1AF4, 0x1110)
DRIVER = Path("/sys/bus/pci/drivers/edu_exerciser")
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
CALLS = ["ioremap", "ioremap_wc", "ioremap_uc", "ioremap_wt", "ioremap_cache", "pci_iomap_wc"]
LEVELS = {0: "armed", 1: "4K", 2: "2M", 3: "1G"}
# the level the exerciser finds is 0 when the entry it looks at is cleared:
# a 2M or 1G entry the helper armed (an armed 4K entry still shows as 4K)
ARMED_HUGE = 0
# kmod/mmiotng.h: NG_SPARES_MIN spares of at most NG_SPARE_MAX_BYTES each
# for a huge BAR, and a BAR of one page (BAR0) keeps NG_SPARES_MAX small ones
SPARE_BOUND = 4 * MiB + 32 * 4 * KiB


@pytest.fixture(scope="module")
def ivshmem(exerciser):
    devs = find_pci_devices(*IVSHMEM)
    by_size = {d.bars[2][1]: d for d in devs}
    assert set(by_size) == {64 * MiB, GiB, 8 * GiB}, [d.bars for d in devs]
    try:
        (DRIVER / "new_id").write_text("1af4 1110\n")
    except OSError as exc:
        assert exc.errno == errno.EEXIST
    for d in devs:
        assert (Path("/sys/kernel/debug") / f"edu_exerciser-{d.name}" / "map").exists()
    return by_size


def do_map(dev, call: str, off: int | None = None, size: int | None = None) -> int:
    """Map BAR2 (or size bytes of it from off) with call, access it; the
    page-table level its start had."""
    d = Path("/sys/kernel/debug") / f"edu_exerciser-{dev.name}"
    window = "" if off is None else f" {off:#x} {size:#x}"
    (d / "map").write_text(f"2 {call}{window}\n")
    return int((d / "level").read_text())


def expected(size: int, off: int = 0) -> list[tuple]:
    """The records of one map of [off, off + size) of BAR2, offsets from BAR2."""
    out: list[tuple] = [("MAP", off, size)]
    for i, o in enumerate((0, (size // 2) & ~7, size - 8)):
        at = off + o
        v = 0x5A000000 | (i << 16) | ((at >> 12) & 0xFFFF)
        out += [("W", 4, at, v), ("R", 4, at, v)]
    return [*out, ("UNMAP",)]


def bar2_words(dev, offsets: list[int], new: int | None = None) -> list[int]:
    """The 32-bit words at these offsets of BAR2, read (and then set to new)
    through its sysfs resource file: a user mapping, which nothing traces or
    emulates."""
    out = []
    with open(f"/sys/bus/pci/devices/{dev.name}/resource2", "r+b") as f:
        for off in offsets:
            with mmap.mmap(f.fileno(), mmap.PAGESIZE, offset=off & ~(mmap.PAGESIZE - 1)) as m:
                at = off & (mmap.PAGESIZE - 1)
                out.append(struct.unpack_from("<I", m, at)[0])
                if new is not None:
                    struct.pack_into("<I", m, at, new)
    return out


def trace_maps(dev, name: str, maps: list[tuple]) -> list[tuple[list, int, str]]:
    """One session on dev; each of maps, (call, off, size), in a section of
    its own: (records from BAR2, the level the exerciser saw, the text).
    The words the maps write are zeroed before, and after the session hold
    what the records say was written: the helper's emulation reached the
    device's memory at the right places (a wrong frame would read back what
    it wrote just as well)."""
    start = dev.bars[2][0]
    words = {r[2]: r[3] for call, off, size in maps
             for r in expected(size or dev.bars[2][1], off or 0) if r[0] == "W"}
    bar2_words(dev, sorted(words), new=0)
    t = NgTracer(["--pci", dev.name], name).start()
    out = []
    try:
        for call, off, size in maps:
            level: list[int] = []
            text = t.section(lambda c=call, o=off, s=size, lv=level:
                             lv.append(do_map(dev, c, o, s)))
            out.append((to_records(text, start), level[0], text))
    finally:
        assert t.stop() == 0
    st = helper_status()
    assert st["armed_pages"] == 0, st
    if any(r[0] == "W" for recs, _, _ in out for r in recs):
        assert bar2_words(dev, sorted(words)) == [words[o] for o in sorted(words)]
    return out


@pytest.mark.parametrize("size", [64 * MiB, GiB], ids=["64MiB", "1GiB"])
def test_whole_bar_is_traced_with_every_call(ivshmem, size):
    """64 MiB is mapped with 2M pages, 1 GiB with one 1G page (QEMU's "max"
    CPU has pdpe1gb, and the BAR is 1 GiB aligned): each armed at its level."""
    dev = ivshmem[size]
    want_level = 2 if size == 64 * MiB else 3
    untraced = do_map(dev, "ioremap")
    assert untraced == want_level, (f"untraced, the BAR was mapped with "
                                    f"{LEVELS.get(untraced, untraced)} pages")
    got = trace_maps(dev, f"ng-ivshmem-{size >> 20}m", [(c, None, None) for c in CALLS])
    for call, (recs, level, text) in zip(CALLS, got, strict=True):
        assert level == ARMED_HUGE, (call, LEVELS.get(level, level))
        assert recs == expected(size), (call, text)


# Windows of the 8 GiB BAR: at its start, across 4 GiB, at its end, and the
# whole of it; (offset, size, the level the kernel maps its start with).
WINDOWS = [
    (0, GiB, 3),
    (4 * GiB - 2 * MiB, 4 * MiB, 2),
    (4 * GiB - 8 * KiB, 16 * KiB, 1),
    (8 * GiB - GiB, GiB, 3),
    (8 * GiB - 2 * MiB, 2 * MiB, 2),
    (0, 8 * GiB, 3),
]


def test_8gib_bar_windows_are_traced_with_every_call(ivshmem):
    """Every window, with every call, traced at its exact physical address
    (past 4 GiB of the BAR too), armed at the level the kernel mapped it
    with."""
    dev = ivshmem[8 * GiB]
    for off, size, lvl in WINDOWS:
        untraced = do_map(dev, "ioremap", off, size)
        assert untraced == lvl, (hex(off), hex(size), LEVELS.get(untraced, untraced))
    maps = [(c, off, size, lvl) for off, size, lvl in WINDOWS for c in CALLS]
    got = trace_maps(dev, "ng-ivshmem-8g", [m[:3] for m in maps])
    for (call, off, size, lvl), (recs, level, text) in zip(maps, got, strict=True):
        assert level == (1 if lvl == 1 else ARMED_HUGE), (call, hex(off), level)
        assert recs == expected(size, off), (call, hex(off), hex(size), text)


def test_an_8gib_bar_keeps_a_bounded_spare(ivshmem):
    """The mappings the helper keeps ready for an 8 GiB BAR (sized for the
    whole BAR, they would take 4 x 64 MiB) stay under SPARE_BOUND."""
    dev = ivshmem[8 * GiB]
    t = NgTracer(["--pci", dev.name], "ng-ivshmem-8g-spares").start()
    try:
        st = helper_status()
        t.section(lambda: do_map(dev, "ioremap"))
        after = helper_status()
    finally:
        assert t.stop() == 0
    print(f"spare bytes for the 8 GiB BAR and its 256-byte BAR0: {st['spare_bytes']}, "
          f"after a map: {after['spare_bytes']}")
    assert st["filters"] == 2, st
    assert 3 * MiB < st["spare_bytes"] <= SPARE_BOUND, st
    assert after["spare_bytes"] <= SPARE_BOUND, after
    assert helper_status()["spare_bytes"] == 0


def test_a_new_mapping_of_too_many_small_pages_is_said_not_traced(ivshmem):
    """200 MiB from 4 KiB into the BAR can only be mapped with 4 KiB pages:
    51200 entries, more than a ready mapping holds (32760) and more than the
    probe may allocate there.  Said NOT traced, with why; the driver's
    accesses work as untraced; the helper holds nothing armed after."""
    dev = ivshmem[8 * GiB]
    off, size = 4 * KiB, 200 * MiB
    ((recs, level, text),) = trace_maps(dev, "ng-ivshmem-too-many", [("ioremap", off, size)])
    assert level == 1, LEVELS.get(level, level)
    marks = [ln for ln in text.splitlines() if "NOT traced" in ln]
    assert len(marks) == 1 and marks[0].endswith(
        "it has more pages than the helper keeps ready for a new mapping (128 MiB or more "
        "of 4 KiB pages): map it before the session starts"), text
    assert not [r for r in recs if r[0] in ("R", "W", "MAP")], recs
