"""diff on real recordings, on the host (tests/guest/test_diff.py and
test_analysis.py made them): two runs of the same scenarios are equal, one
changed write is one hunk; a poll one read longer differs only with
--exact-counts; two loads of e1000, in one boot and in two, are equal once
the descriptor-base registers are ignored; the kernel tracer's text
compares with a recording; --by-marker matches sections by their markers,
so a section added in the middle is one added block and the rest is equal;
a recording that lost records is refused unless --allow-lost."""

from __future__ import annotations

import re
import subprocess

import pytest
from recorded import NG, recording

BLIT = 0x10000      # the lossy recording's one memcpy_toio, in bytes
# e1000 registers that hold DMA addresses (RDBAL/RDBAH, TDBAL/TDBAH)
DESCRIPTOR_BASES = "0x2800,0x2804,0x3800,0x3804"


def diff(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([*NG, "diff", *map(str, argv)], capture_output=True, text=True,
                          timeout=300)


def changed(out: str) -> list[str]:
    return [ln for ln in out.splitlines()
            if ln[:1] in "+-" and not ln.startswith(("---", "+++"))]


def test_by_marker_a_section_added_between_two_is_one_added_block():
    (a, facts), (b, _) = recording("sections-a"), recording("sections-b")
    ident = f"{facts['bar0']:#x}"
    res = diff("--by-marker", a, b)
    assert res.returncode == 1, res.stderr
    lines = changed(res.stdout)
    assert all(ln.startswith("+") for ln in lines), res.stdout
    assert [ln.split()[0] for ln in lines] == ["+MARK", "+MAP", "+R", "+UNMAP"], res.stdout
    assert lines[0].endswith(" extra"), lines[0]
    assert re.fullmatch(rf"\+R 4 {ident} 0x10000ed \(x3\)", lines[2]), lines[2]
    # each recording equals itself section by section, and a's sections are
    # all in b
    assert diff("--by-marker", a, a).returncode == 0
    assert diff("--by-marker", "--exact-counts", b, b).returncode == 0


def test_a_recording_that_lost_records_is_compared_only_with_allow_lost():
    rec, _ = recording("lossy")
    text = subprocess.run([*NG, "report", str(rec)], capture_output=True, text=True,
                          check=True).stdout
    lost = [int(n) for n in re.findall(r"^MARK 0\.000000 Lost (\d+) events\.$", text, re.M)]
    stores = len(re.findall(r"^W 4 ", text, re.M))
    unmaps = len(re.findall(r"^UNMAP ", text, re.M))
    # every store of the blit and the unmap after it: recorded or counted lost
    assert lost and sum(lost) + stores + unmaps == BLIT // 4 + 1, (lost, stores, unmaps)
    refused = diff(rec, rec)
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert len(refused.stderr.splitlines()) == 1 and "--allow-lost" in refused.stderr, \
        refused.stderr
    allowed = diff("--allow-lost", rec, rec)
    assert (allowed.returncode, allowed.stdout) == (0, ""), allowed
    assert "lost" in allowed.stderr, allowed.stderr


def test_two_runs_are_equal_one_changed_write_is_one_hunk():
    (a, facts), (b, _), (c, _) = (recording(n) for n in ("diff-a", "diff-b", "diff-c"))
    same = diff("--exact-counts", a, b)
    assert (same.returncode, same.stdout, same.stderr) == (0, "", "")
    other = diff(a, c)
    assert other.returncode == 1, other.stderr
    assert other.stdout.count("\n@@ ") + other.stdout.startswith("@@ ") == 1, other.stdout
    src = facts["bar0"] + 0x80
    assert changed(other.stdout) == [f"-W 4 {src:#x} 0x5", f"+W 4 {src:#x} 0x6"], \
        other.stdout
    # the text of a recording compares as the recording does
    text = a.with_suffix(".txt")
    text.write_text(subprocess.run([*NG, "report", str(a)], capture_output=True, text=True,
                                   check=True).stdout)
    assert diff(text, b).returncode == 0
    assert diff(text, c).returncode == 1


def test_a_poll_one_read_longer_differs_only_with_exact_counts():
    """rloop 300 and rloop 301: the same by default (a poll's length
    folded), one hunk with --exact-counts, whose two lines carry the
    counts."""
    (r300, facts), (r301, _) = recording("diff-rloop300"), recording("diff-rloop301")
    assert diff(r300, r301).returncode == 0
    exact = diff("--exact-counts", r300, r301)
    assert exact.returncode == 1, exact.stderr
    ident = facts["bar0"]
    assert changed(exact.stdout) == [f"-R 4 {ident:#x} 0x10000ed (x300)",
                                     f"+R 4 {ident:#x} 0x10000ed (x301)"], exact.stdout


def test_two_loads_of_e1000_are_equal_but_for_descriptor_bases():
    (one, facts), (two, _) = recording("diff-e1000-1"), recording("diff-e1000-2")
    res = diff("--exact-counts", "--ignore-value", DESCRIPTOR_BASES, one, two)
    assert (res.returncode, res.stderr) == (0, ""), res.stdout[:4000]
    plain = diff(one, two)
    print(f"without --ignore-value: exit {plain.returncode}\n{plain.stdout[:2000]}")
    assert plain.returncode in (0, 1), plain.stderr
    assert {int(ln.split()[2], 16) - facts["bar0"] for ln in changed(plain.stdout)} <= {
        0x2800, 0x2804, 0x3800, 0x3804}, plain.stdout


@pytest.mark.second_boot
def test_e1000_in_another_boot_equals_the_first():
    """The second boot's load of e1000 (tests/run's second guest) equals the
    first boot's; the PCIDEV lines say what differs between the boots and
    is no traffic (interrupt lines, the drivers bound), the descriptor-base
    registers hold new DMA addresses."""
    (first, _), (this, _) = recording("diff-e1000-1"), recording("diff-e1000-boot2")
    res = diff("--ignore-header", "--ignore-value", DESCRIPTOR_BASES, first, this)
    assert (res.returncode, res.stderr) == (0, ""), res.stdout[:4000]
    # and the boots' headers do differ: the option is what makes them equal
    assert diff("--ignore-value", DESCRIPTOR_BASES, first, this).returncode == 1


def test_the_kernel_tracers_text_compares_with_a_recording():
    """The same scenarios under the kernel's mmiotrace and recorded by
    mmiotrace-ng, in the same boot: diff --compat (the recording read as the
    kernel's decoder would) finds them equal, and one changed write apart."""
    (ours, _), (other, _) = recording("diff-k"), recording("diff-k6")
    text = ours.parent / "diff-kernel.txt"
    res = diff("--compat", "--exact-counts", text, ours)
    assert (res.returncode, res.stderr) == (0, ""), res.stdout[:4000]
    assert diff("--compat", text, other).returncode == 1
