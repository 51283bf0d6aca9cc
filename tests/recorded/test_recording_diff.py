"""diff on real recordings, on the host: --by-marker matches sections by
their markers, so a section added in the middle is one added block and the
rest is equal; a recording that lost records is refused unless
--allow-lost (tests/guest/test_analysis.py made them)."""

from __future__ import annotations

import re
import subprocess

from recorded import NG, recording

BLIT = 0x10000      # the lossy recording's one memcpy_toio, in bytes


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
