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
from kernel_tracer import find_pci_device
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
    exit (handled) after them and before the next entry; as many as the handler handled, with the
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
        got = steps(text, bar0)
        assert [s for s in got if not s.startswith("exit")] == [
            "raise 1", f"enter {vector} {dev} edu_exerciser", "status 1", "ack 1"] * COUNT, text
        # each exit after its handler's ack, before the next handler's entry;
        # the next raise may come before it: the handler may run on another
        # CPU (the first interrupt after the line was pointed at this CPU)
        where = {kind: [i for i, s in enumerate(got) if s.startswith(kind)]
                 for kind in ("enter", "ack", "exit")}
        assert [got[i] for i in where["exit"]] == [f"exit {vector} {dev} handled"] * COUNT
        assert all(a < x for a, x in zip(where["ack"], where["exit"], strict=True)), text
        assert all(x < e for x, e in zip(where["exit"][:-1], where["enter"][1:], strict=True)), text
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


E1000_ID = (0x8086, 0x100E)
E1000_TRAFFIC = """
set -e
modprobe e1000
for i in $(seq 100); do [ -d /sys/bus/pci/devices/{bdf}/net ] && break; sleep 0.1; done
nic=$(ls /sys/bus/pci/devices/{bdf}/net)
ip link set "$nic" up
ip addr add 10.0.2.15/24 dev "$nic"
sleep 2
python3 -c "
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(20):
    s.sendto(b'mmiotrace-ng', ('10.0.2.2', 9)); time.sleep(0.05)
"
echo "$nic $(cat /sys/bus/pci/devices/{bdf}/irq)" > {nicfile}
rmmod e1000
"""


def irq_counts() -> dict[int, int]:
    """The interrupts the kernel counted on each line, all CPUs."""
    return {int(p.parent.name): sum(int(n) for n in p.read_text().strip().split(","))
            for p in Path("/sys/kernel/irq").glob("*/per_cpu_count")}


def test_e1000_interrupts_are_those_the_kernel_counted(tmp_path):
    """e1000 loaded, brought up, sending datagrams and unloaded under
    --irq: a handler entry, with the NIC's name, for every interrupt the
    kernel counted on its line meanwhile, each with its exit.  The line is
    the one the device got when its driver enabled it, after the start."""
    nic = find_pci_device(*E1000_ID)
    assert nic is not None, "boot the VM with --qemu '-device e1000,...'"
    subprocess.run(["rmmod", "e1000"], capture_output=True)
    before = irq_counts()
    nicfile = tmp_path / "nic"
    script = E1000_TRAFFIC.replace("{bdf}", nic.name).replace("{nicfile}", str(nicfile))
    t = NgTracer(["--pci", nic.name, "--irq"], "ng-irq-e1000").start()
    try:
        text = t.section(lambda: subprocess.run(["sh", "-c", script], check=True))
    finally:
        assert t.stop() == 0, t.stderr()
    name, line_text = nicfile.read_text().split()
    line = int(line_text)       # given when the driver enabled the device
    counted = irq_counts()[line] - before.get(line, 0)
    marks = [m.groups() for ln in text.splitlines() if (m := IRQ_MARK.match(ln))]
    enters = [m for m in marks if m[2] == "enter"]
    assert counted > 0 and len(enters) == counted, (counted, marks[:20])
    assert {m[:3] for m in enters} == {(str(line), nic.name, "enter")}
    assert {m[3] for m in enters} == {name}
    assert [m[2] for m in marks] == ["enter", "exit"] * counted
