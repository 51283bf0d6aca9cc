"""usermaps: the traced ranges processes had mapped before the start, from
/proc/PID/maps (a fake /proc and sysfs here), and their NOT-traced records
as the renderer prints them."""

from __future__ import annotations

from pathlib import Path

from mmiotrace_ng.format.records import NG_ERR_USER_MAP, NgRecType, parse
from mmiotrace_ng.format.render import untraced_text
from mmiotrace_ng.tracer import usermaps

DEV = "sys/devices/pci0000:00/0000:00:05.0"
BAR0, BAR2 = 0xfe000000, 0xfd000000


def fake(tmp_path: Path, maps: dict[int, str]) -> tuple[str, str]:
    root = tmp_path / "root"
    (root / DEV).mkdir(parents=True)
    (root / DEV / "resource").write_text(
        f"0x{BAR0:016x} 0x{BAR0 + 0xfffff:016x} 0x0000000000040200\n"
        "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
        f"0x{BAR2:016x} 0x{BAR2 + 0xfff:016x} 0x0000000000040200\n")
    proc = tmp_path / "proc"
    for pid, text in maps.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "maps").write_text(text)
    (proc / "self").mkdir()         # not a process directory: skipped
    return str(proc), str(root)


def line(start: int, end: int, offset: int, path: str) -> str:
    return f"{start:x}-{end:x} rw-s {offset:08x} 00:13 4711                       {path}\n"


def test_a_mapped_resource_file_overlapping_a_traced_range_is_found(tmp_path):
    # the kernel's PCI mmap shows the physical address as the offset (pid
    # 42, 9); a mapping that kept its offset into the BAR shows that (7)
    proc, root = fake(tmp_path, {
        42: line(0x7f0000000000, 0x7f0000002000, BAR0 + 0x3000, f"/{DEV}/resource0")
            + line(0x7f1000000000, 0x7f1000001000, 0, "/usr/lib/libc.so.6"),
        7: line(0x7f2000000000, 0x7f2000001000, 0, f"/{DEV}/resource2_wc"),
        9: line(0x7f3000000000, 0x7f3000001000, BAR0, f"/{DEV}/resource0"),
    })
    # BAR 0 from 0x2000 on is traced, BAR 2 is not
    found = usermaps.find([(BAR0 + 0x2000, BAR0 + 0x100000)], proc, root)
    assert found == [(42, 0x7f0000000000, BAR0 + 0x3000, 0x2000)]
    found = usermaps.find([(BAR2, BAR2 + 0x1000), (BAR0, BAR0 + 0x1000)], proc, root)
    assert found == [(7, 0x7f2000000000, BAR2, 0x1000), (9, 0x7f3000000000, BAR0, 0x1000)]


def test_nothing_is_found_without_a_traced_range_or_with_an_unknown_device(tmp_path):
    proc, root = fake(tmp_path, {
        42: line(0x7f0000000000, 0x7f0000001000, BAR0, f"/{DEV}/resource0"),
        43: line(0x7f0000000000, 0x7f0000001000, BAR0, "/sys/devices/pci0000:00/gone/resource0"),
    })
    assert usermaps.find([], proc, root) == []
    assert usermaps.find([(BAR0 + 0x1000, BAR0 + 0x2000)], proc, root) == []


def test_the_records_render_as_the_probe_s_do():
    (raw,) = usermaps.records([(42, 0x7f0000000000, BAR0 + 0x3000, 0x2000)])
    rec = parse(raw)
    assert rec.hdr.type == NgRecType.NG_REC_UNTRACED and rec.hdr.ts_ns > 0
    assert (rec.pid, rec.virt, rec.phys, rec.len, rec.err) == (
        42, 0x7f0000000000, BAR0 + 0x3000, 0x2000, -NG_ERR_USER_MAP)
    assert untraced_text(rec) == (
        f"mmiotrace-ng: the range {BAR0 + 0x3000:#x} size 0x2000 is mapped into process 42 "
        "at 0x7f0000000000: its accesses from user space are NOT traced")


def test_a_mapped_file_name_that_is_not_utf8_does_not_stop_the_scan(tmp_path):
    proc, root = fake(tmp_path, {
        42: line(0x7f0000000000, 0x7f0000001000, BAR0, f"/{DEV}/resource0"),
    })
    maps = Path(proc, "42", "maps")
    maps.write_bytes(line(0x7e0000000000, 0x7e0000001000, 0, "/memfd:\xff (deleted)")
                     .encode("latin-1") + maps.read_bytes())
    assert usermaps.find([(BAR0, BAR0 + 0x1000)], proc, root) == [
        (42, 0x7f0000000000, BAR0, 0x1000)]


def test_a_page_the_helper_gave_up_is_said_with_its_process_and_why():
    from mmiotrace_ng.format.abi import MMIOTNG_ERR_USER_INSN, MMIOTNG_ERR_USER_KERNEL
    from mmiotrace_ng.format.records import NgRecUntraced

    for err, why in ((MMIOTNG_ERR_USER_KERNEL, "an access to it from kernel mode"),
                     (MMIOTNG_ERR_USER_INSN, "an access to it the helper does not emulate")):
        rec = NgRecUntraced(phys=0xFEA01000, virt=0x7F0000001000, len=0x1000, err=-err, pid=77)
        assert untraced_text(rec).startswith(
            "mmiotrace-ng: the page 0xfea01000 of process 77's mapping at 0x7f0000001000 is "
            f"NOT traced from here on: {why}")
