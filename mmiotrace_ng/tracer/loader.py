"""The MMIO tracer's BPF programs: loaded, configured and attached to the
ioremap/iounmap kprobes and the helper's tracepoints; their ring buffer."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Any

from ..common import bpfsys
from ..common.bpfload import (
    BPF_PROG_TYPE_KPROBE,
    BPF_PROG_TYPE_RAW_TRACEPOINT,
    BPF_PROG_TYPE_RAW_TRACEPOINT_WRITABLE,
    LoaderError,
    compiled,
    create_maps,
    load_program,
    map_lookup,
    map_update,
    prefetch,
    read_drops,
    source_dir,
)
from ..common.bpfobj import BpfObject
from ..common.phases import PHASES
from ..common.ringbuf import RingReader
from ..format.abi import MMIOTNG_ACCESS_TP, MMIOTNG_MAP_TP, MMIOTNG_MARK_TP
from ..format.records import (
    NG_CONFIG_ALL,
    NG_CONFIG_HISTOGRAM,
    NG_CONFIG_TRACER,
    NG_IRQ_LINES,
    NG_NAME_LEN,
    NG_TRACED_DEVS,
    NG_USER_RANGES,
    NgDevName,
    NgHistKey,
    NgHistVal,
    NgPhysRange,
)
from . import layout, pci

IOREMAP_FAMILY = ("ioremap", "ioremap_uc", "ioremap_wc", "ioremap_wt", "ioremap_cache",
                  "ioremap_prot", "ioremap_encrypted")


def kernel_tracepoint(system: str, name: str) -> bool | None:
    """Whether the kernel has this tracepoint (tracefs says), None if no
    tracefs is mounted to say."""
    for base in TRACEFS:
        if (base / "events").is_dir():
            return (base / "events" / system / name).is_dir()
    return None


def kernel_functions(names: tuple[str, ...]) -> list[str]:
    """Those of names the running kernel has as functions (kallsyms)."""
    with open("/proc/kallsyms", "rb") as fh:
        text = fh.read()
    # one regex pass: a Python loop over the 100k+ lines is slow under TCG
    pattern = rb"^[0-9a-f]+ [tT] (" + b"|".join(re.escape(n.encode()) for n in names) + rb")$"
    found = {m.decode() for m in re.findall(pattern, text, re.MULTILINE)}
    return [n for n in names if n in found]


SOURCE = "mmiotrace_ng.bpf.c"
# loaded at the start; IRQ_PROGRAMS and DMA_PROGRAMS when asked for, if the
# object has them (the kernel's BTF said where the members they read are:
# layout.py)
BASE_PROGRAMS = ("on_ioremap_entry", "on_ioremap_return", "on_iounmap", "on_access", "on_mark",
                 "on_map")
IRQ_PROGRAMS = ("on_setup_irq", "on_pci_enable", "on_pci_enable_return", "on_irq_entry",
                "on_irq_exit")
DMA_PROGRAMS = ("on_dma_map", "on_dma_unmap", "on_dma_alloc", "on_dma_free", "on_dma_map_sg",
                "on_dma_unmap_sg")
# a traced range mapped into a process: said, not traced (remap_pfn_range)
USER_MAP_PROGRAM = "on_remap_pfn_range"
USER_MAP_FUNCTION = "remap_pfn_range"
# a process's traced mapping goes: its UNMAP (vm_area_free)
USER_UNMAP_PROGRAM = "on_vm_area_free"
USER_UNMAP_FUNCTION = "vm_area_free"
# 6.4 to 6.13: vm_area_free() frees after a grace period through
# __vm_area_free(), which exit calls directly
USER_UNMAP_RCU_PROGRAM = "on___vm_area_free"
USER_UNMAP_RCU_FUNCTION = "__vm_area_free"
USER_UNMAP_RCU_CALLBACK = "vm_area_free_rcu_cb"
# what compiled()/prefetch() get of the tracer's object beside its source
OBJECT_OPTIONS: dict[str, Any] = {"optional": (*IRQ_PROGRAMS, *DMA_PROGRAMS, USER_MAP_PROGRAM,
                                               USER_UNMAP_PROGRAM, USER_UNMAP_RCU_PROGRAM),
                                  "defines": layout.kernel_defines}
NO_LAYOUT = ("this kernel's BTF (/sys/kernel/btf/vmlinux) does not say where the kernel keeps "
             "what the {} programs read: {} not traced")
TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
# Programs on the helper's tracepoints (raw tracepoints: unlike kprobes they
# also run when the access is made from inside another kprobe's handler).
TRACEPOINT_PROGRAMS = {"on_access": MMIOTNG_ACCESS_TP, "on_mark": MMIOTNG_MARK_TP,
                       "on_map": MMIOTNG_MAP_TP}
# The traced devices' interrupts (--irq, record): the kernel's tracepoints
# around each hard interrupt handler, and where a handler is installed.
IRQ_TRACEPOINTS = {"on_irq_entry": "irq_handler_entry", "on_irq_exit": "irq_handler_exit"}
IRQ_SETUP = "__setup_irq"
PCI_ENABLE = "pcibios_enable_device"        # sets a device's INTx line (x86)
# The traced devices' DMA mappings (--dma, record): the kernel's dma
# tracepoints (6.12 and later; 7.x names map/unmap_page and _resource *_phys).
DMA_TRACEPOINTS = {
    "on_dma_map": ("dma_map_page", "dma_map_resource", "dma_map_phys"),
    "on_dma_unmap": ("dma_unmap_page", "dma_unmap_resource", "dma_unmap_phys"),
    "on_dma_alloc": ("dma_alloc", "dma_alloc_pages"),
    "on_dma_free": ("dma_free", "dma_free_pages"),
    "on_dma_map_sg": ("dma_map_sg",),
    "on_dma_unmap_sg": ("dma_unmap_sg",),
}
DMA_NOT_HERE = ("this kernel has no dma tracepoints (Linux 6.12 and later have them): DMA "
                "mappings are not traced")
RAW_TRACEPOINT_PROGRAMS = (*TRACEPOINT_PROGRAMS, *IRQ_TRACEPOINTS, *DMA_TRACEPOINTS)
# Those that read the tracepoint's buffer in place: the helper's access
# tracepoint is writable (its buffer the record), so no probe read copies it.
WRITABLE_TRACEPOINT_PROGRAMS = ("on_access",)


def start_compile() -> None:
    """Begin getting the tracer's BPF object in the background (a first
    start compiles it); `tracer_object` takes it over."""
    prefetch(source_dir("bpf") / SOURCE, BASE_PROGRAMS, **OBJECT_OPTIONS)


def tracer_object() -> tuple[BpfObject, bool]:
    """The tracer's BPF object, and whether it came from the cache."""
    return compiled(source_dir("bpf") / SOURCE, BASE_PROGRAMS, **OBJECT_OPTIONS)


class Probes:
    """The loaded BPF programs, attached, and their ring buffer.

    Everything is held by file descriptors of this process: if it dies, the
    kernel detaches the programs and frees the maps."""

    def __init__(self, all_maps: bool, buffer_kb: int, histogram: bool = False) -> None:
        self.fds: list[int] = []               # maps and programs
        self.probe_fds: list[int] = []
        self.tp_fds: list[int] = []
        self.attached: list[str] = []
        self.ring: RingReader | None = None
        self._devices: dict[str, NgDevName] | None = None
        pages = max(1, buffer_kb * 1024 // 4096)
        pages = 1 << (pages - 1).bit_length()  # the ring buffer wants a power of two
        self.buffer_bytes = pages * 4096
        obj, cached = tracer_object()
        PHASES.done("BPF object " + ("(cached)" if cached else "(compiled)") + ", waited for")
        self._obj = obj
        try:
            self.maps = self._create_maps(obj)
            self._configure(all_maps, histogram)
            self.progs: dict[str, int] = {}
            self._load_programs(BASE_PROGRAMS)
            PHASES.done("BPF maps and programs loaded (verifier)")
            self._attach(all_maps)
            self.ring = RingReader(self.maps["events"], self.buffer_bytes)
            PHASES.done("BPF programs attached, ring buffer mapped")
        except BaseException:
            self.close()
            raise

    def _create_maps(self, obj: BpfObject) -> dict[str, int]:
        """The object's maps, the ring buffer with the size asked for."""
        fds, self._by_old = create_maps(obj, {"events": self.buffer_bytes}, self.fds)
        return fds

    def _configure(self, all_maps: bool, histogram: bool) -> None:
        """The settings, into the map "config", before any program runs: the
        tracer's pid (the helper's own mappings are made from this process
        and must stay out of an --all trace), --all and --histogram."""
        for slot, value in ((NG_CONFIG_TRACER, os.getpid()), (NG_CONFIG_ALL, int(all_maps)),
                            (NG_CONFIG_HISTOGRAM, int(histogram))):
            self._update("config", ctypes.c_int(slot), ctypes.c_uint32(value))

    def _load_programs(self, names: tuple[str, ...]) -> None:
        """Load those of these programs not loaded yet (the verifier checks
        each: under TCG the scatterlist ones take a second or more)."""
        for name in names:
            if name in self.progs:
                continue
            kind = (BPF_PROG_TYPE_RAW_TRACEPOINT_WRITABLE if name in WRITABLE_TRACEPOINT_PROGRAMS
                    else BPF_PROG_TYPE_RAW_TRACEPOINT if name in RAW_TRACEPOINT_PROGRAMS
                    else BPF_PROG_TYPE_KPROBE)
            self.progs[name] = fd = load_program(kind, name, self._obj, self._by_old)
            self.fds.append(fd)

    def _attach_one(self, event: str, prog: str, retprobe: bool = False) -> None:
        try:
            self.probe_fds.append(bpfsys.attach_kprobe(event, self.progs[prog], retprobe))
        except OSError as exc:
            raise LoaderError(f"cannot attach a kprobe to {event}: {exc.strerror}") from exc

    def _attach(self, all_maps: bool) -> None:
        """The helper's tracepoints; the ioremap family only for --all (the
        MAP of the mappings the helper does not arm)."""
        family = kernel_functions(IOREMAP_FAMILY) if all_maps else []
        if all_maps and not family:
            raise LoaderError("this kernel has no ioremap function to probe")
        for fn in family:
            self._attach_one(fn, "on_ioremap_entry")
            self._attach_one(fn, "on_ioremap_return", retprobe=True)
            self.attached.append(fn)
        self._attach_one("iounmap", "on_iounmap")
        self.attached.append("iounmap")
        for prog, tp in TRACEPOINT_PROGRAMS.items():
            try:
                fd = bpfsys.raw_tracepoint_open(tp, self.progs[prog])
            except OSError as exc:
                raise LoaderError(f"cannot attach to the helper's tracepoint {tp} "
                                  f"({exc.strerror}): is the loaded mmiotng module of "
                                  "this version?") from exc
            self.tp_fds.append(fd)
            self.attached.append(tp)

    def _trace_devices(self, devices: list[str], notes: list[str]) -> dict[str, NgDevName]:
        """The devices' names into the map traced_devs (once; the first
        NG_TRACED_DEVS: the rest are said in notes)."""
        if self._devices is None:
            if len(devices) > NG_TRACED_DEVS:
                notes.append(f"{len(devices)} devices: the interrupts and DMA of the first "
                             f"{NG_TRACED_DEVS} only are traced")
            self._devices = {dev: NgDevName(dev.encode()[:NG_NAME_LEN - 1])
                             for dev in devices[:NG_TRACED_DEVS]}
            for name in self._devices.values():
                self._update("traced_devs", name, ctypes.c_uint8(1))
        return self._devices

    def _open_tracepoint(self, tp: str, prog: str) -> bool:
        """Attach prog to the kernel's tracepoint tp; False if it has none."""
        try:
            self.tp_fds.append(bpfsys.raw_tracepoint_open(tp, self.progs[prog]))
        except OSError:
            return False
        self.attached.append(tp)
        return True

    def _kprobe(self, function: str, prog: str, retprobe: bool = False) -> bool:
        """A kprobe on function; False if the kernel cannot probe it."""
        try:
            self.probe_fds.append(bpfsys.attach_kprobe(function, self.progs[prog], retprobe))
        except OSError:
            return False
        return True

    def trace_irqs(self, devices: list[str]) -> list[str]:
        """Record the interrupts of these devices (PCI addresses): those
        requested from now on (the __setup_irq kprobe, for MSI vectors),
        then those they have now (sysfs), into the filter map irq_lines.
        What cannot be followed is said in the list returned (for stderr)."""
        if not all(p in self._obj.progs for p in IRQ_PROGRAMS):
            return [NO_LAYOUT.format("interrupt", "interrupts are")]
        notes: list[str] = []
        names = self._trace_devices(devices, notes)
        self._load_programs(IRQ_PROGRAMS)
        if self._kprobe(IRQ_SETUP, "on_setup_irq"):
            self.attached.append(IRQ_SETUP)
        else:
            notes.append(f"cannot probe {IRQ_SETUP}: MSI vectors requested while tracing are "
                         "not followed")
        if self._kprobe(PCI_ENABLE, "on_pci_enable") and \
                self._kprobe(PCI_ENABLE, "on_pci_enable_return", retprobe=True):
            self.attached.append(PCI_ENABLE)
        else:
            notes.append(f"cannot probe {PCI_ENABLE}: the INTx line of a device enabled "
                         "while tracing is not followed")
        irqs = [(irq, name) for dev, name in names.items() for irq in pci.device_irqs(dev)]
        if len(irqs) > NG_IRQ_LINES:
            notes.append(f"{len(irqs)} interrupts: the first {NG_IRQ_LINES} only are traced")
        for irq, name in irqs[:NG_IRQ_LINES]:
            self._update("irq_lines", ctypes.c_uint32(irq), name)
        for prog, tp in IRQ_TRACEPOINTS.items():
            if not self._open_tracepoint(tp, prog):
                notes.append(f"this kernel has no tracepoint {tp}: interrupts are not traced")
                break
        return notes

    def report_user_maps(self, ranges: list[tuple[int, int]]) -> list[str]:
        """Say each mapping of these physical ranges [lo, hi) that a driver
        makes into a process from now on (remap_pfn_range: a sysfs
        resourceN file's mmap, a driver's own mmap): a NOT-traced
        record with the process and the user address.  What cannot be said
        is in the list returned."""
        notes = []
        if len(ranges) > NG_USER_RANGES:
            notes.append(f"{len(ranges)} ranges: mappings into processes are said of the "
                         f"first {NG_USER_RANGES} only")
        for i, (lo, hi) in enumerate(ranges[:NG_USER_RANGES]):
            self._update("user_ranges", ctypes.c_uint32(i), NgPhysRange(lo, hi - lo))
        try:
            if USER_MAP_PROGRAM in self._obj.progs:
                self._load_programs((USER_MAP_PROGRAM,))
        except LoaderError as exc:
            notes.append(str(exc))
        if USER_MAP_PROGRAM in self.progs and self._kprobe(USER_MAP_FUNCTION, USER_MAP_PROGRAM):
            self.attached.append(USER_MAP_FUNCTION)
            return notes
        return [*notes, f"cannot probe {USER_MAP_FUNCTION}: a traced range mapped into a "
                "process (its accesses from user space are not traced) is not said"]

    def trace_user_unmaps(self) -> list[str]:
        """The UNMAP of each process's traced mapping when it goes (munmap,
        exit, exec, mremap).  What cannot be done is in the list returned."""
        notes = []
        progs = tuple(p for p in (USER_UNMAP_PROGRAM, USER_UNMAP_RCU_PROGRAM)
                      if p in self._obj.progs)
        try:
            self._load_programs(progs)
        except LoaderError as exc:
            notes.append(str(exc))
        if USER_UNMAP_PROGRAM not in self.progs:
            return [*notes, "processes' mappings get no UNMAP line: the kernel's BTF does not "
                    "say where a VMA keeps its start and address space"]
        # a kernel whose vm_area_free() hands VMAs to RCU: exit frees them
        # through __vm_area_free() directly
        if layout.kernel_function(USER_UNMAP_RCU_CALLBACK):
            if USER_UNMAP_RCU_PROGRAM in self.progs and \
                    self._kprobe(USER_UNMAP_RCU_FUNCTION, USER_UNMAP_RCU_PROGRAM):
                self.attached.append(USER_UNMAP_RCU_FUNCTION)
            else:
                notes.append(f"a process's mapping gets no UNMAP line at its exit: "
                             f"{USER_UNMAP_RCU_FUNCTION} cannot be probed")
        if self._kprobe(USER_UNMAP_FUNCTION, USER_UNMAP_PROGRAM):
            self.attached.append(USER_UNMAP_FUNCTION)
            return notes
        return [*notes, "processes' mappings get no UNMAP line: "
                f"{USER_UNMAP_FUNCTION} cannot be probed, or the kernel's BTF does not say "
                "where a VMA keeps its start and address space"]

    def trace_dma(self, devices: list[str]) -> list[str]:
        """Record the DMA mappings of these devices: the kernel's dma
        tracepoints that it has.  What is not traced is said in the list
        returned."""
        if not all(p in self._obj.progs for p in DMA_PROGRAMS):
            return [NO_LAYOUT.format("DMA", "DMA mappings are")]
        notes: list[str] = []
        self._trace_devices(devices, notes)
        found = []
        for prog, tps in DMA_TRACEPOINTS.items():
            here = [tp for tp in tps if kernel_tracepoint("dma", tp) is not False]
            if here:
                self._load_programs((prog,))
                found += [self._open_tracepoint(tp, prog) for tp in here]
        return notes if any(found) else [*notes, DMA_NOT_HERE]

    def pending(self, timeout_ms: int) -> memoryview:
        """The ring buffer's unread bytes (ringbuf.RingReader.pending), after
        waiting up to timeout_ms for some if there are none."""
        assert self.ring is not None
        view = self.ring.pending()
        if not view:
            self.ring.wait(timeout_ms)
            view = self.ring.pending()
        return view

    def consume(self, nbytes: int) -> None:
        """Hand the first nbytes of `pending` back to the BPF programs."""
        assert self.ring is not None
        self.ring.consume(nbytes)

    def _update(self, name: str, key: ctypes._CData, value: ctypes._CData) -> None:
        map_update(self.maps, name, key, value)

    def histogram(self) -> tuple[dict[tuple[int, int, int, int], NgHistVal], int]:
        """--histogram: {(phys, ip, op, width): counts} from the map "hist",
        and the accesses it had no room for."""
        out = {(k.phys, k.ip, k.op, k.width): v
               for k, v in bpfsys.map_items(self.maps["hist"], NgHistKey, NgHistVal)}
        full = (ctypes.c_uint64 * 1)()
        map_lookup(self.maps, "hist_full", ctypes.c_int(0), full)
        return out, full[0]

    def drops(self) -> tuple[int, int]:
        """(records dropped in all, dropped but not yet reported in a record)."""
        return read_drops(self.maps["drops"])

    def misses(self) -> int:
        """Runs of the programs that the kernel skipped because one was
        already running on that CPU (a BPF program's recursion, which the
        design avoids: the helper defers its NMI-level records): each a
        record lost, counted nowhere else."""
        return sum(bpfsys.prog_info(fd)["recursion_misses"] for fd in self.progs.values())

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        for fd in reversed(self.tp_fds):
            os.close(fd)
        self.tp_fds = []
        for fd in reversed(self.probe_fds):
            os.close(fd)
        self.probe_fds = []
        for fd in reversed(self.fds):
            os.close(fd)
        self.fds = []
