"""The records each edu_exerciser scenario must produce, as machine-readable data.

One record per traced access, in the kernel's mmiotrace format reduced to
what does not change from run to run (no timestamps, virtual addresses, map
ids, pc or pid), with physical addresses as offsets from the start of BAR0:

    ("MAP", offset, length)          ioremap/pci_iomap; length as passed
    ("UNMAP",)                       iounmap/pci_iounmap
    ("R", width, offset, value)      read: width in bytes, value read
    ("W", width, offset, value)      write: value written
    ("UNKNOWN", offset, (b0, b1, b2))  an access pf_in.c cannot decode, with
                                     the first three bytes at the faulting pc

tests/guest/kernel_tracer.py:to_records() turns a captured stream into the
same tuples.  ``expected(name, count)`` gives a scenario's list;
``SCENARIOS[name]`` is a list, or a function of COUNT for the scenarios that
take one (``COUNTED``).

How the records were derived (not copied from a trace):
- values from the device: 0x00 ident reads 0x010000ed; 0x04 liveness reads
  the bitwise inverse of the last 4- or 8-byte write (bits 63..32 ignored on
  a 4-byte read); 0x20 status and 0x24 irq status read 0 while no factorial
  or irq was started; 0x80/0x88 DMA src/dst hold the last 4- or 8-byte write
  (a 4-byte write clears bits 63..32); a 4-byte read of an offset with no
  register returns 0xffffffff, an 8-byte read below 0x80 all ones.  QEMU
  rejects 1- and 2-byte accesses to edu before the device sees them: such a
  read returns 0 and such a write changes nothing.
- widths and values from the instructions (objdump -d of edu_exerciser.o and
  of Debian's 6.1.0-57 vmlinux) and what arch/x86/mm/pf_in.c makes of them:
  readX/writeX are single movs (8a/8b/88/89, with 66 or REX.W prefixes),
  ioreadX/iowriteX in lib/iomap.c use the same movs, a read reports the
  destination register after the access, a write the source register or the
  immediate (c7).  memcpy_toio/memcpy_fromio are ``rep movsl`` (f3 a5) followed
  by ``testb $2,%bl`` (f6 c3 02) and tails ``movsw`` (66 a5, then f6) and
  ``movsb`` (a4, then 5b 5d); memset_io is ``rep stosb`` (f3 aa) on a CPU with
  ERMS (QEMU's ``-cpu max``), which pf_in.c decodes as a 1-byte write of %al
  (without ERMS: ``NO_ERMS``).
  A rep instruction single-stepped under the tracer faults once per
  iteration, so each iteration is one record at its own address.
- the instruction bytes of ``unknown`` are fixed by inline asm with fixed
  registers and displacements (edu_exerciser.c).

One kernel deviation is recorded apart (``KERNEL_DEVIATIONS``): kmmio looks a
fault up by the start of its page, so the kernel's tracer does not see the
accesses in the first page of a mapping that does not start on a page
boundary (``unaligned``); ``expected(name, kernel=True)`` applies it.
"""

from __future__ import annotations

from collections.abc import Callable

BAR0_LEN = 0x100000
IDENT = 0x010000ED
DEFAULT_COUNT = 1000
SPARE_PAGE = 0x1000          # first BAR0 page without registers

Record = tuple


def MAP(offset: int = 0, length: int = BAR0_LEN) -> Record:  # noqa: N802 (named after the record)
    return ("MAP", offset, length)


UNMAP: Record = ("UNMAP",)


def R(width: int, offset: int, value: int) -> Record:  # noqa: N802 (named after the record)
    return ("R", width, offset, value)


def W(width: int, offset: int, value: int) -> Record:  # noqa: N802 (named after the record)
    return ("W", width, offset, value)


def UNKNOWN(offset: int, insn: tuple[int, int, int]) -> Record:  # noqa: N802 (named after the record)
    return ("UNKNOWN", offset, insn)


# First three instruction bytes of the accesses pf_in.c does not decode.
REP_MOVSL = (0xF3, 0xA5, 0xF6)   # memcpy_{to,from}io: rep movsl; testb $2,%bl
MOVSW = (0x66, 0xA5, 0xF6)       # memcpy_toio tail: movsw; testb $1,%bl
MOVSB = (0xA4, 0x5B, 0x5D)       # memcpy_toio tail: movsb; pop %rbx; pop %rbp
OR_IMM8 = (0x83, 0x4F, 0x04)     # orl $0x1,0x4(%rdi)
XCHG = (0x87, 0x47, 0x04)        # xchg %eax,0x4(%rdi)
TEST_IMM32 = (0xF7, 0x07, 0xED)  # testl $0x10000ed,(%rdi)


def _rloop(n: int) -> list[Record]:
    return [MAP(), *[R(4, 0x00, IDENT)] * n, UNMAP]


def _wloop(n: int) -> list[Record]:
    return [MAP(), *[W(4, 0x04, i) for i in range(n)], UNMAP]


def _cloop(n: int) -> list[Record]:
    recs = [MAP()]
    recs += [UNKNOWN(SPARE_PAGE + 4 * k, REP_MOVSL) for k in range(n // 4)]
    if n & 2:
        recs.append(UNKNOWN(SPARE_PAGE + (n & ~3), MOVSW))
    if n & 1:
        recs.append(UNKNOWN(SPARE_PAGE + n - 1, MOVSB))
    return recs + [UNMAP]


def _burst(n: int) -> list[Record]:
    # Two threads, n reads each; all records are the same, so their
    # interleaving does not matter.
    return [MAP(), *[R(4, 0x00, IDENT)] * (2 * n), UNMAP]


SCENARIOS: dict[str, list[Record] | Callable[[int], list[Record]]] = {
    # readb of ident, liveness, DMA src: 1-byte reads return 0.
    "readb": [MAP(), R(1, 0x00, 0), R(1, 0x04, 0), R(1, 0x80, 0), UNMAP],
    # readw of ident and DMA src: 2-byte reads return 0.
    "readw": [MAP(), R(2, 0x00, 0), R(2, 0x80, 0), UNMAP],
    # readl of ident, status, irq status, and 0x40 where there is no register.
    "readl": [MAP(), R(4, 0x00, IDENT), R(4, 0x20, 0), R(4, 0x24, 0),
              R(4, 0x40, 0xFFFFFFFF), UNMAP],
    # writeq/readq of DMA src; readq of ident (8 bytes below 0x80: all ones).
    "readq": [MAP(), W(8, 0x80, 0x0123456789ABCDEF), R(8, 0x80, 0x0123456789ABCDEF),
              R(8, 0x00, 0xFFFFFFFFFFFFFFFF), UNMAP],
    # writel liveness, writeb liveness (ignored), readl liveness.
    "writeb": [MAP(), W(4, 0x04, 0x11223344), W(1, 0x04, 0xAA), R(4, 0x04, 0xEEDDCCBB),
               UNMAP],
    # writel liveness, writew liveness (ignored), readl liveness.
    "writew": [MAP(), W(4, 0x04, 0x11223344), W(2, 0x04, 0xBBBB), R(4, 0x04, 0xEEDDCCBB),
               UNMAP],
    "writel": [MAP(), W(4, 0x04, 0x12345678), R(4, 0x04, 0xEDCBA987), UNMAP],
    # writeq/readq DMA dst, then readl of its low half.
    "writeq": [MAP(), W(8, 0x88, 0xFEDCBA9876543210), R(8, 0x88, 0xFEDCBA9876543210),
               R(4, 0x88, 0x76543210), UNMAP],
    "ioread8": [MAP(), R(1, 0x00, 0), UNMAP],
    "ioread16": [MAP(), R(2, 0x00, 0), UNMAP],
    "ioread32": [MAP(), R(4, 0x00, IDENT), UNMAP],
    "iowrite8": [MAP(), W(4, 0x04, 0x01020304), W(1, 0x04, 0x55), R(4, 0x04, 0xFEFDFCFB),
                 UNMAP],
    "iowrite16": [MAP(), W(4, 0x04, 0x01020304), W(2, 0x04, 0x5555),
                  R(4, 0x04, 0xFEFDFCFB), UNMAP],
    "iowrite32": [MAP(), W(4, 0x04, 0xA5A5A5A5), R(4, 0x04, 0x5A5A5A5A), UNMAP],
    # movl $0xcafef00d,(%rdi) (c7 07 imm32): the immediate is the value.
    "imm": [MAP(), W(4, 0x04, 0xCAFEF00D), R(4, 0x04, 0x35010FF2), UNMAP],
    # memcpy_toio of bytes 00..0f to 0x80: one UNKNOWN per rep movsl
    # iteration at the destination; 0x84 and 0x8c are not registers.
    "toio": [MAP(), W(8, 0x80, 0), W(8, 0x88, 0),
             *[UNKNOWN(0x80 + 4 * k, REP_MOVSL) for k in range(4)],
             R(8, 0x80, 0x03020100), R(8, 0x88, 0x0B0A0908), UNMAP],
    # memcpy_fromio of 16 bytes from 0x80: one UNKNOWN per iteration at the
    # source; the module checks the bytes (88 77 66 55 ff.. 00 ff ee dd ff..).
    "fromio": [MAP(), W(8, 0x80, 0x1122334455667788), W(8, 0x88, 0x99AABBCCDDEEFF00),
               *[UNKNOWN(0x80 + 4 * k, REP_MOVSL) for k in range(4)], UNMAP],
    # memset_io(0x80, 0xa5, 8) on a CPU with ERMS: rep stosb, eight 1-byte
    # writes of %al, all ignored by edu (DMA src stays 0).  Without ERMS see
    # NO_ERMS below.
    "memset": [MAP(), W(8, 0x80, 0), *[W(1, 0x80 + k, 0xA5) for k in range(8)],
               R(8, 0x80, 0), UNMAP],
    # read-modify-write of liveness: (0xffff00ff & ~0xf) | 0x5.
    "rmw": [MAP(), W(4, 0x04, 0x0000FF00), R(4, 0x04, 0xFFFF00FF), W(4, 0x04, 0xFFFF00F5),
            R(4, 0x04, 0x0000FF0A), UNMAP],
    # ioremap of only the page at 0x1000 (no registers there).
    "subpage": [MAP(SPARE_PAGE, 0x1000), R(4, 0x1000, 0xFFFFFFFF),
                R(4, 0x1FFC, 0xFFFFFFFF), UNMAP],
    # ioremap(BAR0 + 0x80, 0x1000): starts inside page 0, ends in page 1.
    "unaligned": [MAP(0x80, 0x1000), W(4, 0x80, 0x13579BDF), R(4, 0x80, 0x13579BDF),
                  W(4, 0x88, 0x2468ACE0), R(8, 0x88, 0x2468ACE0),
                  R(4, 0x1000, 0xFFFFFFFF), UNMAP],
    # orl $1 (RMW of liveness: 0xfffffff0 -> writes 0xfffffff1), readl,
    # xchg (gets 0xe, writes 0x600df00d), testl of ident, readl.
    "unknown": [MAP(), W(4, 0x04, 0xF), UNKNOWN(0x04, OR_IMM8), R(4, 0x04, 0xE),
                UNKNOWN(0x04, XCHG), UNKNOWN(0x00, TEST_IMM32), R(4, 0x04, 0x9FF20FF2),
                UNMAP],
    # COUNT readl of ident.
    "rloop": _rloop,
    # COUNT writel of 0, 1, ..., COUNT-1 to liveness.
    "wloop": _wloop,
    # one writel of COUNT to DMA src: two runs differ in that write alone.
    "wval": lambda n: [MAP(), W(4, 0x80, n), UNMAP],
    # memcpy_toio of COUNT bytes (i & 0xff) to 0x1000 (0 <= COUNT <= 0xff000).
    "cloop": _cloop,
    # COUNT readl of ident on each of the first two online CPUs at once.
    "burst": _burst,
}

NAMES = list(SCENARIOS)
COUNTED = frozenset(name for name, recs in SCENARIOS.items() if callable(recs))

# On a CPU without ERMS (e.g. QEMU "-cpu max,erms=off"), memset() stores the
# 8 bytes at once (rep stosq f3 48 ab: one 8-byte write of %rax), which edu
# keeps.
NO_ERMS: dict[str, list[Record]] = {
    "memset": [MAP(), W(8, 0x80, 0), W(8, 0x80, 0xA5A5A5A5A5A5A5A5),
               R(8, 0x80, 0xA5A5A5A5A5A5A5A5), UNMAP],
}

# What the kernel's own tracer prints where it differs from the accesses made.
KERNEL_DEVIATIONS: dict[str, list[Record]] = {
    # kmmio_handler() looks the probe up with the fault's page base, which
    # is below the start of an unaligned mapping: accesses in its first page
    # are not traced (no pre/post handler runs); those in the next page are.
    "unaligned": [MAP(0x80, 0x1000), R(4, 0x1000, 0xFFFFFFFF), UNMAP],
}


def expected(name: str, count: int | None = None, *, kernel: bool = False,
             erms: bool = True) -> list[Record]:
    """Records of scenario ``name`` run with ``count`` (default DEFAULT_COUNT
    for the scenarios that take one).  ``kernel=True``: what the kernel's
    own mmiotrace prints, with its known deviations.  ``erms``: whether
    memset_io() stores byte by byte here (rep stosb: Linux 6.1 on a CPU with
    ERMS; Exerciser.memset_bytewise() in the guest tests tells)."""
    recs = SCENARIOS[name]
    if kernel and name in KERNEL_DEVIATIONS:
        recs = KERNEL_DEVIATIONS[name]
    elif not erms and name in NO_ERMS:
        recs = NO_ERMS[name]
    if callable(recs):
        return recs(DEFAULT_COUNT if count is None else count)
    if count is not None:
        raise ValueError(f"{name} takes no COUNT")
    return list(recs)


def decoded(name: str, count: int | None = None, *, erms: bool = True) -> list[Record]:
    """What mmiotrace-ng's default mode prints for scenario ``name``: the
    string instructions (UNKNOWN in the kernel's tracer) decoded into one
    R or W per element, with its value."""
    recs = expected(name, count, erms=erms)
    if name == "toio":      # bytes 00..0f to 0x80 as four rep movsl stores
        data = bytes(range(16))
        return [r if r[0] != "UNKNOWN" else
                ("W", 4, r[1], int.from_bytes(data[r[1] - 0x80:r[1] - 0x7C], "little"))
                for r in recs]
    if name == "fromio":    # loads of DMA src (0x80), dst (0x88) and no register
        values = {0x80: 0x55667788, 0x84: 0xFFFFFFFF, 0x88: 0xDDEEFF00, 0x8C: 0xFFFFFFFF}
        return [r if r[0] != "UNKNOWN" else ("R", 4, r[1], values[r[1]]) for r in recs]
    if name == "cloop":     # COUNT bytes (i & 0xff) to the spare page
        out = []
        for r in recs:
            if r[0] != "UNKNOWN":
                out.append(r)
                continue
            width = {REP_MOVSL: 4, MOVSW: 2, MOVSB: 1}[r[2]]
            i = r[1] - SPARE_PAGE
            out.append(("W", width, r[1], int.from_bytes(
                bytes((i + k) & 0xFF for k in range(width)), "little")))
        return out
    return recs


def command(name: str, count: int | None = None) -> str:
    """The line to write to /sys/kernel/debug/edu_exerciser/run."""
    return name if count is None else f"{name} {count}"
