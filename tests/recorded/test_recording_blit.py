"""The 16 MiB blit the guest recorded with record's default ring
(tests/guest/test_record.py): every store in the file, in order, with its
address and value, and nothing lost; checked here, where reading four
million records takes seconds."""

from __future__ import annotations

import ctypes
import subprocess
import sys

from recorded import NG, REPO, recording

sys.path.insert(0, str(REPO / "tests" / "guest"))
from kernel_tracer import to_records  # noqa: E402

from mmiotrace_ng.arguments import RECORD_BUFFER_KB  # noqa: E402
from mmiotrace_ng.format.records import NgRecAccess  # noqa: E402

RING_HEADER = 8         # a BPF ring buffer record's header, records 8-aligned


def blit_word(k: int) -> int:
    """The exerciser's blit: the 32-bit word at BAR offset 4k (its README)."""
    return (0x9E3779B1 * (k + 1)) & 0xFFFFFFFF


def assert_same_records(got: list, want: list) -> None:
    """got == want, said by the first difference (pytest's own diff of
    millions of records takes minutes)."""
    first = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w),
                 min(len(got), len(want)))
    same = got == want      # a bool: pytest would diff the lists themselves
    assert same, (f"{len(got)} records, {len(want)} made; the first difference at "
                  f"{first}: {got[first:first + 3]} for {want[first:first + 3]}")


def test_the_default_ring_keeps_a_16_mib_blit():
    rec, facts = recording("blit")
    nbytes = facts["blit_bytes"]
    stores = nbytes // 4
    want = [("MAP", 0, nbytes),
            *(("W", 4, 4 * k, blit_word(k)) for k in range(stores)),
            ("UNMAP",)]
    # more than the default ring holds: the reader had to keep up
    per = (ctypes.sizeof(NgRecAccess) + RING_HEADER + 7) & ~7
    assert stores * per > 4 * RECORD_BUFFER_KB * 1024
    res = subprocess.run([*NG, "report", str(rec)], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    assert_same_records(to_records(res.stdout, facts["bar0"]), want)
