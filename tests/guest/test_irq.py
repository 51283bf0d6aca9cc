"""The traced device's interrupts beside its accesses (--irq).

The exerciser raises edu's interrupt (a write of 1 to 0x60) and its
handler reads the status (0x24) and acks it (0x64), COUNT times, through
INTx and through MSI, with the interrupt sent to the CPU that writes.
The truth comes from the exerciser: how many interrupts its handler
handled and the interrupt number the kernel gave it.
"""

from __future__ import annotations

import re
import subprocess

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
