"""The traced device's interrupts and DMA mappings beside its accesses
(--irq, --dma).

The exerciser raises edu's interrupt (a write of 1 to 0x60) and its
handler reads the status (0x24) and acks it (0x64), COUNT times, through
INTx and through MSI, with the interrupt sent to the CPU that writes.
The truth comes from the exerciser: how many interrupts its handler
handled and the interrupt number the kernel gave it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import EXERCISER_DEBUGFS
from ng_tracer import NG, NgTracer, sections

COUNT = 5
STRESS = EXERCISER_DEBUGFS / "stress"
IRQ_MARK = re.compile(r"^MARK \d+\.\d{6} irq (\d+) (\S+) (enter|exit) (\S+)$")
ACCESS = re.compile(r"^([RW]) 4 \d+\.\d{6} \d+ (0x[0-9a-f]+) (0x[0-9a-f]+) ")


def stress(line: str) -> None:
    STRESS.write_text(line + "\n")


def dbg(name: str) -> int:
    return int((EXERCISER_DEBUGFS / name).read_text().split()[0], 0)


def steps(text: str, bar0: int) -> list[str]:
    """The section's interrupt lines and its accesses of 0x60, 0x24, 0x64,
    in order, as words: raise, enter IRQ DEV HANDLER, status V, ack V,
    exit IRQ DEV RESULT."""
    out = []
    names = {(0x60, "W"): "raise", (0x24, "R"): "status", (0x64, "W"): "ack"}
    for line in text.splitlines():
        if m := IRQ_MARK.match(line):
            out.append(" ".join(m.group(3, 1, 2, 4)))
        elif (m := ACCESS.match(line)) and (name := names.get((int(m[2], 16) - bar0, m[1]))):
            out.append(f"{name} {int(m[3], 16)}")
    return out


def test_interrupts_are_in_the_trace_where_they_happened(exerciser):
    """INTx, then MSI: each interrupt's entry comes after the write that
    raised it, the handler's read of the status and its ack inside it, its
    exit (handled) after them; as many as the handler handled, with the
    interrupt number the kernel gave; none without --irq in the same
    recording's report, which with --irq equals the live text."""
    dev, bar0 = exerciser.dev.name, exerciser.bar0[0]
    t = NgTracer(["--pci", dev, "--irq"], "ng-irq").start()
    try:
        intx = t.section(lambda: stress(f"irq_intx {COUNT}"))
        intx_vector, intx_handled = dbg("irq_vector"), dbg("irq_handled")
        msi = t.section(lambda: stress(f"irq_msi {COUNT}"))
        msi_vector, msi_handled = dbg("irq_vector"), dbg("irq_handled")
    finally:
        assert t.stop() == 0, t.stderr()
    assert intx_handled == msi_handled == COUNT
    assert intx_vector != msi_vector, "the MSI vector is the INTx line?"
    for text, vector in ((intx, intx_vector), (msi, msi_vector)):
        want = ["raise 1", f"enter {vector} {dev} edu_exerciser", "status 1", "ack 1",
                f"exit {vector} {dev} handled"] * COUNT
        assert steps(text, bar0) == want, text[-3000:]
    assert f"{4 * COUNT} interrupt records" in t.stderr(), t.stderr()
    live = t.text()
    with_irq = subprocess.run([*NG, "report", "--irq", str(t.raw)], capture_output=True,
                              text=True, check=True).stdout
    assert with_irq == live
    plain = subprocess.run([*NG, "report", str(t.raw)], capture_output=True, text=True,
                           check=True).stdout
    assert plain == "".join(line for line in live.splitlines(keepends=True)
                            if not IRQ_MARK.match(line))
    # the MSI section: MAP, three accesses an interrupt, UNMAP
    assert " irq " not in plain and sections(plain)[2].count("\n") == 3 * COUNT + 2


DMA_MARK = re.compile(r"^MARK \d+\.\d{6} dma (\S+) (\S+) (0x[0-9a-f]+) (\d+) (\S+)$")
DMA_TRACEPOINTS = Path("/sys/kernel/tracing/events/dma")


def test_dma_mappings_are_in_the_trace_before_the_registers_that_use_them(exerciser):
    """edu DMA of a mapped page to the device and back into a coherent
    buffer: on a kernel with the dma tracepoints, the coherent buffer's
    alloc, the page's map, the writes of exactly those bus addresses to the
    DMA address registers, the unmap and the free, in that order; on one
    without them, one line on stderr says DMA is not traced there."""
    dev, bar0 = exerciser.dev.name, exerciser.bar0[0]
    t = NgTracer(["--pci", dev, "--dma"], "ng-dma").start()
    try:
        text = t.section(lambda: stress("dma"))
    finally:
        assert t.stop() == 0, t.stderr()
    to, back = dbg("dma_to"), dbg("dma_from")
    assert to and back
    if not DMA_TRACEPOINTS.is_dir():
        assert t.stderr().count("DMA mappings are not traced") == 1, t.stderr()
        assert " dma " not in text
        return
    got = []
    for line in text.splitlines():
        if m := DMA_MARK.match(line):
            assert m[2] == dev and m[4] == "4096", line
            got.append(f"{m[1]} {int(m[3], 16):#x} {m[5]}")
        elif (m := re.match(r"^W 8 \S+ \d+ (0x[0-9a-f]+) (0x[0-9a-f]+) ", line)) \
                and int(m[1], 16) - bar0 in (0x80, 0x88):
            got.append(f"W {int(m[1], 16) - bar0:#x} {int(m[2], 16):#x}")
    assert got == [f"alloc {back:#x} bidirectional", f"map {to:#x} to-device",
                   f"W 0x80 {to:#x}", "W 0x88 0x40000", "W 0x80 0x40000", f"W 0x88 {back:#x}",
                   f"unmap {to:#x} to-device", f"free {back:#x} bidirectional"], text
    assert "DMA mappings are not traced" not in t.stderr()
