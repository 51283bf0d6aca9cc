"""Render records as the kernel's mmiotrace text, format 20070824, byte for byte.

Pure functions for each kind of line, plus `Renderer`, which holds the options,
counts what it saw and has a fast batch path for access records.

The output is `str`; marker text that is not UTF-8 is decoded with
"surrogateescape", so `text.encode(ENCODING, ERRORS)` gives back the exact bytes.
"""

from __future__ import annotations

import ctypes
import errno
import re
import struct
from collections.abc import Iterable
from itertools import groupby, repeat
from operator import add, and_, floordiv, mod, not_
from typing import Final, NamedTuple

from mmiotrace_ng.common import ringbuf
from mmiotrace_ng.format.abi import (
    MMIOTNG_ERR_USER_INSN,
    MMIOTNG_ERR_USER_KERNEL,
    MMIOTNG_OP_READ,
    MMIOTNG_OP_UNKNOWN,
    MMIOTNG_OP_WRITE,
)
from mmiotrace_ng.format.records import (
    NG_ERR_USER_MAP,
    VALID_OPS,
    BadRecord,
    NgRecAccess,
    NgRecDma,
    NgRecIrq,
    NgRecMap,
    NgRecMark,
    NgRecType,
    NgRecUnmap,
    NgRecUntraced,
    Record,
    field,
    mark_text,
    parse,
    unpacker,
)

ENCODING: Final = "utf-8"
ERRORS: Final = "surrogateescape"

VERSION_LINE: Final = "VERSION 20070824\n"
USEC_PER_SEC: Final = 1_000_000
NSEC_PER_SEC: Final = 1_000_000_000
_U32: Final = 0xFFFF_FFFF
_U64: Final = 0xFFFF_FFFF_FFFF_FFFF

# The format strings of kernel/trace/trace_mmiotrace.c (Linux 6.1) with the C
# length modifiers dropped (Python's % has no "ll"); the C argument types are
# reproduced by the callers (secs is a 32-bit `unsigned`, see ts_parts).
FMT_PCIDEV_HEAD: Final = "PCIDEV %02x%02x %04x%04x %x"  # mmio_print_pcidev, l. 68
FMT_PCIDEV_NUM: Final = " %x"  # l. 73 and l. 80, 7 times each
FMT_R: Final = "R %d %u.%06u %d 0x%x 0x%x 0x%x %d\n"  # mmio_print_rw, l. 181
FMT_W: Final = "W %d %u.%06u %d 0x%x 0x%x 0x%x %d\n"  # l. 188
FMT_UNKNOWN: Final = "UNKNOWN %u.%06u %d 0x%x %02x,%02x,%02x 0x%x %d\n"  # l. 195
FMT_MAP: Final = "MAP %u.%06u %d 0x%x 0x%x 0x%x 0x%x %d\n"  # mmio_print_map, l. 226
FMT_UNMAP: Final = "UNMAP %u.%06u %d 0x%x %d\n"  # l. 233
FMT_MARK: Final = "MARK %u.%06u %s"  # mmio_print_mark, l. 255
FMT_LOST: Final = "MARK 0.000000 Lost %u events.\n"  # mmio_read, l. 142

PCI_NUM_PRINTED_RESOURCES: Final = 7  # BARs 0-5 and the ROM


class Options(NamedTuple):
    """compat: print what the kernel's mmiotrace would (compat_op/width/value).
    show_pc: print the instruction address instead of 0x0 (the kernel's
    trace_pc=1 does so for R/W/UNKNOWN only; in compat mode MAP/UNMAP keep 0x0).
    show_pid: print the pid instead of 0 (the kernel always prints 0).
    irq: print the traced devices' interrupts as MARK lines (irq_line); the
    20070824 text has no line of its own for them.
    dma: print their DMA mappings as MARK lines (dma_line)."""

    compat: bool = False
    show_pc: bool = False
    show_pid: bool = False
    irq: bool = False
    dma: bool = False


DEFAULT_OPTIONS: Final = Options()


def ts_parts(ns: int) -> tuple[int, int]:
    """(secs, usecs) as the kernel prints them: ns2usecs() rounds to the nearest
    microsecond in u64 arithmetic (kernel/trace/trace.c), do_div splits off the
    seconds, which are then truncated to a 32-bit `unsigned`."""
    usecs = ((ns + 500) & _U64) // 1000
    return (usecs // USEC_PER_SEC) & _U32, usecs % USEC_PER_SEC


def lost_line(n: int) -> str:
    return FMT_LOST % n


def _pc_pid(
    ip: int, pid: int, opts: Options, pc_allowed: bool = True
) -> tuple[int, int]:
    return (ip if opts.show_pc and pc_allowed else 0, pid if opts.show_pid else 0)


def access_line(rec: NgRecAccess, opts: Options = DEFAULT_OPTIONS) -> str:
    """The R, W or UNKNOWN line of an access record."""
    secs, usecs = ts_parts(rec.hdr.ts_ns)
    pc, pid = _pc_pid(rec.ip, rec.pid, opts)
    if opts.compat:
        op, width, value = rec.compat_op, rec.compat_width, rec.compat_value
        unknown = ((value >> 16) & 0xFF, (value >> 8) & 0xFF, value & 0xFF)
    else:
        op, width, value = rec.op, rec.width, rec.value
        unknown = (rec.insn[0], rec.insn[1], rec.insn[2])
    if op == MMIOTNG_OP_READ:
        return FMT_R % (width, secs, usecs, rec.map_id, rec.phys, value, pc, pid)
    if op == MMIOTNG_OP_WRITE:
        return FMT_W % (width, secs, usecs, rec.map_id, rec.phys, value, pc, pid)
    if op == MMIOTNG_OP_UNKNOWN:
        return FMT_UNKNOWN % (secs, usecs, rec.map_id, rec.phys, *unknown, pc, pid)
    raise BadRecord(f"NG_REC_ACCESS with op {op}")


def map_line(rec: NgRecMap, opts: Options = DEFAULT_OPTIONS) -> str:
    secs, usecs = ts_parts(rec.hdr.ts_ns)
    pc, pid = _pc_pid(rec.ip, rec.pid, opts, pc_allowed=not opts.compat)
    return FMT_MAP % (secs, usecs, rec.map_id, rec.phys, rec.virt, rec.len, pc, pid)


def unmap_line(rec: NgRecUnmap, opts: Options = DEFAULT_OPTIONS) -> str:
    secs, usecs = ts_parts(rec.hdr.ts_ns)
    pc, pid = _pc_pid(rec.ip, rec.pid, opts, pc_allowed=not opts.compat)
    return FMT_UNMAP % (secs, usecs, rec.map_id, pc, pid)


def mark_line(rec: NgRecMark) -> str:
    """As tracing_mark_write() stores it (a newline added unless the written
    text ends in one) and mmio_print_mark() prints it (%s: up to a NUL)."""
    text = mark_text(rec)
    if not text.endswith(b"\n"):
        text += b"\n"
    text = text.split(b"\0", 1)[0]
    secs, usecs = ts_parts(rec.hdr.ts_ns)
    return FMT_MARK % (secs, usecs, text.decode(ENCODING, ERRORS))


# irqreturn_t's bits (include/linux/irqreturn.h) as an IRQ line names them
IRQ_RESULTS: Final = ((1, "handled"), (2, "wake-thread"))


def irq_text(rec: NgRecIrq) -> str:
    """What an IRQ record says: "irq 24 0000:00:05.0 enter edu" at a
    handler's entry (its name last), "irq 24 0000:00:05.0 exit handled" at
    its exit (none: IRQ_NONE, the interrupt was not the handler's)."""
    dev = rec.dev.decode(ENCODING, ERRORS)
    if not rec.exit:
        return f"irq {rec.irq} {dev} enter {rec.handler.decode(ENCODING, ERRORS)}"
    return f"irq {rec.irq} {dev} exit {irq_result(rec.ret)}"


def irq_result(ret: int) -> str:
    """An irqreturn_t in words: "handled", "wake-thread", both joined by
    "+", or "none" (IRQ_NONE)."""
    return "+".join(name for bit, name in IRQ_RESULTS if ret & bit) or "none"


def irq_line(rec: NgRecIrq) -> str:
    secs, usecs = ts_parts(rec.hdr.ts_ns)
    return FMT_MARK % (secs, usecs, irq_text(rec) + "\n")


# enum ng_dma_kind and enum dma_data_direction as a DMA line names them
DMA_KINDS: Final = ("map", "unmap", "alloc", "free", "map-sg", "unmap-sg")
DMA_DIRECTIONS: Final = ("bidirectional", "to-device", "from-device", "none")
# irq_text's and dma_text's texts read back from a MARK line (annotate, the
# tables): irq, device, enter|exit, handler|result; kind, device, bus
# address, size, direction
IRQ_TEXT_RE: Final = re.compile(r"irq (\d+) (\S+) (enter|exit) (.+)")
DMA_TEXT_RE: Final = re.compile(r"dma (\S+) (\S+) 0x([0-9a-f]+) (\d+) (\S+)")


def dma_words(kind: int, way: int) -> tuple[str, str]:
    """A DMA record's kind and direction in words (a number past the
    tables, a newer tracer's: kind-N, dir-N)."""
    return (DMA_KINDS[kind] if kind < len(DMA_KINDS) else f"kind-{kind}",
            DMA_DIRECTIONS[way] if way < len(DMA_DIRECTIONS) else f"dir-{way}")


def dma_numbers(kind: str, way: str) -> tuple[int, int] | None:
    """dma_words read back; None if either is not a word of theirs."""
    out = []
    for word, words, what in ((kind, DMA_KINDS, "kind-"), (way, DMA_DIRECTIONS, "dir-")):
        if word in words:
            out.append(words.index(word))
        elif word.startswith(what) and word[len(what):].isdigit():
            out.append(int(word[len(what):]))
        else:
            return None
    return out[0], out[1]


def dma_text(rec: NgRecDma) -> str:
    """What a DMA record says: "dma map 0000:00:05.0 0x1f3a000 4096
    to-device": the kind, the device, the bus address the device uses, the
    size in bytes, the direction."""
    kind, way = dma_words(rec.kind, rec.dir)
    return f"dma {kind} {rec.dev.decode(ENCODING, ERRORS)} 0x{rec.addr:x} {rec.size} {way}"


def dma_line(rec: NgRecDma) -> str:
    secs, usecs = ts_parts(rec.hdr.ts_ns)
    return FMT_MARK % (secs, usecs, dma_text(rec) + "\n")


# Why the helper left a mapping of a traced range unarmed (-errno of the
# mmiotng_map tracepoint, kmod/mmiotng_probes.c and mmiotng_filters.c).
UNTRACED_REASONS: Final[dict[int, str]] = {
    2: "it is not inside one traced BAR",                   # ENOENT
    12: "the helper ran out of memory",                     # ENOMEM
    14: "its pages are not mapped (unmapped meanwhile?)",  # EFAULT
    16: "it was being unmapped",                            # EBUSY
    22: "its pages map another physical range",            # EINVAL
    7: "its page-table entries changed while it was armed",  # E2BIG
    95: "its pages are of a size the helper does not arm",  # EOPNOTSUPP
    # a new mapping of more page-table entries than the helper keeps ready
    # (kmod/mmiotng.h, NG_SPARE_MAX_BYTES), and none could be allocated there
    27: "it has more pages than the helper keeps ready for a new mapping (128 MiB "
        "or more of 4 KiB pages): map it before the session starts",  # EFBIG
    28: "the helper traces no more ranges at a time",        # ENOSPC
    # an NMI (or a kprobe handler) made an access the helper cannot emulate
    # there, and an NMI cannot be single-stepped: the page was given back
    35: "an access in an NMI could not be emulated: one of its pages is "
        "not traced from here on",                           # EDEADLK
    19: "the device was removed",                           # ENODEV
    # a movs between the device and user memory without stac, which the
    # CPU (SMAP) refuses: the page was given back, the access runs as it
    # would untraced (the kernel oopses)
    1: "an access to user memory without stac, which SMAP refuses: one of "
       "its pages is not traced from here on",               # EPERM
    # a traced BAR moved (resized or reassigned) there, where the helper
    # could not move its filter: its caller could not sleep (kmod/mmiotng_pci.c)
    11: "a traced BAR moved there in a context that cannot sleep",  # EAGAIN
}


def untraced_reason(err: int) -> str:
    return UNTRACED_REASONS.get(-err, f"error {-err}")


# the helper's words for a page of a process's mapping it stopped tracing
USER_PAGE_REASONS: Final[dict[int, str]] = {
    MMIOTNG_ERR_USER_KERNEL: "an access to it from kernel mode (a read() or write() of the "
                             "mapping) or from a 32-bit process",
    MMIOTNG_ERR_USER_INSN: "an access to it the helper does not emulate (an instruction it "
                           "does not know, a locked one, or a missing page on the other side "
                           "of a copy)",
}


def untraced_text(rec: NgRecUntraced) -> str:
    """What a MARK line (and the tracer's stderr) says of a mapping that is not traced."""
    if not rec.virt and rec.err == -errno.ENODEV:   # a traced device went away
        return (f"mmiotrace-ng: the range 0x{rec.phys:x} size 0x{rec.len:x} is NOT traced "
                f"any more: {untraced_reason(rec.err)}")
    if rec.err == -errno.EXDEV:     # a traced BAR moved; virt: where to, if followed
        where = f" to 0x{rec.virt:x}, which is traced from here on" if rec.virt else ""
        return (f"mmiotrace-ng: the range 0x{rec.phys:x} size 0x{rec.len:x} is NOT traced "
                f"any more: its BAR was moved (resized or reassigned){where}")
    if not rec.virt and rec.err == -errno.EAGAIN:
        return (f"mmiotrace-ng: the range 0x{rec.phys:x} size 0x{rec.len:x} is NOT traced: "
                f"{untraced_reason(rec.err)}")
    if -rec.err in USER_PAGE_REASONS:   # a page of a process's mapping given up
        return (f"mmiotrace-ng: the page 0x{rec.phys:x} of process {rec.pid}'s mapping at "
                f"0x{rec.virt:x} is NOT traced from here on: {USER_PAGE_REASONS[-rec.err]}")
    if rec.err == -NG_ERR_USER_MAP:     # mapped into a process (remap_pfn_range)
        return (f"mmiotrace-ng: the range 0x{rec.phys:x} size 0x{rec.len:x} is mapped into "
                f"process {rec.pid} at 0x{rec.virt:x}: its accesses from user space are NOT "
                "traced")
    if not rec.virt:    # a BAR of a device bound (or moved) while tracing
        return (f"mmiotrace-ng: the range 0x{rec.phys:x} size 0x{rec.len:x} of a PCI device "
                f"bound while tracing is NOT traced: {untraced_reason(rec.err)}")
    return (f"mmiotrace-ng: ioremap of 0x{rec.phys:x} size 0x{rec.len:x} at 0x{rec.virt:x} "
            f"is NOT traced: {untraced_reason(rec.err)}")


def untraced_line(rec: NgRecUntraced) -> str:
    secs, usecs = ts_parts(rec.hdr.ts_ns)
    return FMT_MARK % (secs, usecs, untraced_text(rec) + "\n")


def record_text(rec: Record, opts: Options = DEFAULT_OPTIONS) -> str:
    """The text of one parsed record: the lost-events marker if the record says
    events were dropped before it, then its line."""
    lost = lost_line(rec.hdr.lost) if rec.hdr.lost else ""
    if isinstance(rec, NgRecAccess):
        return lost + access_line(rec, opts)
    if isinstance(rec, NgRecMap):
        return lost + map_line(rec, opts)
    if isinstance(rec, NgRecUnmap):
        return lost + unmap_line(rec, opts)
    if isinstance(rec, NgRecUntraced):
        return lost + untraced_line(rec)
    if isinstance(rec, NgRecIrq):
        return lost + (irq_line(rec) if opts.irq else "")
    if isinstance(rec, NgRecDma):
        return lost + (dma_line(rec) if opts.dma else "")
    return lost + mark_line(rec)


def pcidev_lines(proc_bus_pci_devices_text: str) -> list[str]:
    """PCIDEV lines from the text of /proc/bus/pci/devices.

    drivers/pci/proc.c show_device() prints the same numbers as
    mmio_print_pcidev() (starts OR'ed with flags & PCI_REGION_FLAG_MASK, sizes
    end - start + 1 or 0, the driver name), tab separated and padded, in the
    same device order (both walk pci_get_device()); only the layout differs.
    """
    lines = []
    for lineno, line in enumerate(proc_bus_pci_devices_text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t", 3 + 2 * PCI_NUM_PRINTED_RESOURCES)
        nums = fields[: 3 + 2 * PCI_NUM_PRINTED_RESOURCES]
        driver = (
            fields[3 + 2 * PCI_NUM_PRINTED_RESOURCES] if len(fields) > len(nums) else ""
        )
        try:
            if len(nums) != 3 + 2 * PCI_NUM_PRINTED_RESOURCES:
                raise ValueError(f"{len(fields)} fields")
            busdevfn, vendev, irq, *res = (int(f, 16) for f in nums)
        except ValueError as e:
            raise ValueError(
                f"/proc/bus/pci/devices line {lineno} malformed ({e}): {line!r}"
            ) from None
        head = FMT_PCIDEV_HEAD % (
            busdevfn >> 8,
            busdevfn & 0xFF,
            vendev >> 16,
            vendev & 0xFFFF,
            irq,
        )
        lines.append(
            head + "".join(FMT_PCIDEV_NUM % n for n in res) + " " + driver + "\n"
        )
    return lines


def stream_header(proc_bus_pci_devices_text: str) -> str:
    """VERSION line and PCIDEV lines: what the kernel prints before any record."""
    return VERSION_LINE + "".join(pcidev_lines(proc_bus_pci_devices_text))


# --- fast path for access records -------------------------------------------

# The four u8 fields width, op, compat_width, compat_op are read as one u32 and
# looked up in a table of the combinations the fast path renders.
_OPBYTES_OFFSET: Final = NgRecAccess.width.offset
if [
    NgRecAccess.op.offset,
    NgRecAccess.compat_width.offset,
    NgRecAccess.compat_op.offset,
] != [
    _OPBYTES_OFFSET + 1,
    _OPBYTES_OFFSET + 2,
    _OPBYTES_OFFSET + 3,
]:
    raise ImportError(
        "ng_rec_access: width/op/compat_width/compat_op are no longer adjacent"
    )

_FAST_WIDTHS: Final = (1, 2, 4, 8)
# secs < 2**32 and ts + 500 < 2**64 below this: no masking needed
_FAST_TS_LIMIT: Final = (1 << 32) * USEC_PER_SEC * 1000 - 500
_PC_PID_TAIL: Final = " 0x%x %d\n"
_HEAD: Final = "%u.%06u %d "  # timestamp and map id, after "R 4 " or "W 4 "
_CHUNK: Final = 1024  # records rendered by one `%`
_SHORT_RUN: Final = 4  # shorter runs cost less one by one than as a chunk
_ACCESS: Final = NgRecType.NG_REC_ACCESS
_ACCESS_SIZE: Final = ctypes.sizeof(NgRecAccess)
_ACCESS_STRIDE: Final = ringbuf.stride(_ACCESS_SIZE)
_SHORT_HEADS: Final = [_ACCESS_SIZE] * _SHORT_RUN


def _fast_formats(opts: Options) -> dict[int, str]:
    """u32 of (width, op, compat_width, compat_op) -> the R/W format with the
    width (and, unless shown, pc and pid) filled in."""
    if opts.show_pc or opts.show_pid:
        tail = (
            " "
            + ("0x%x" if opts.show_pc else "0x0%.0s")
            + " "
            + ("%d" if opts.show_pid else "0%.0s")
            + "\n"
        )
    else:
        tail = " 0x0 0\n"
    table = {}
    for op, fmt in ((MMIOTNG_OP_READ, FMT_R), (MMIOTNG_OP_WRITE, FMT_W)):
        assert fmt.endswith(_PC_PID_TAIL) and fmt[1:5] == " %d "
        for width in _FAST_WIDTHS:
            line = fmt[0] + " " + str(width) + " " + fmt[5 : -len(_PC_PID_TAIL)] + tail
            assert line.index(_HEAD) == 4
            sel = width | op << 8
            for other_op in VALID_OPS:
                for other_width in range(256):
                    other = other_width | other_op << 8
                    key = (
                        (other << 16 | sel) if not opts.compat else (sel << 16 | other)
                    )
                    table[key] = line
    return table


def access_column(path: str, code: str | None = None) -> tuple[str, int]:
    """(memoryview format, index of the first record's item) of a field of
    access records lying one stride apart in ring memory; code overrides the
    field's own (e.g. "I" reads four adjacent u8 fields as one u32)."""
    offset, own = field(NgRecAccess, path)
    offset += ringbuf.HEADER
    code = code or own
    size = struct.calcsize(code)
    if offset % size or _ACCESS_STRIDE % size:
        raise ImportError(f"ng_rec_access.{path} is not {size}-byte aligned")
    return code, offset // size


class Renderer:
    """Renders raw records with fixed options and counts them.

    counts: records rendered, by type; lost: events the records said were
    dropped; bad: records rejected as corrupt;
    untraced: what was said of each mapping that is not traced, for the
    tracer to repeat on stderr (the caller empties it)."""

    def __init__(
        self, compat: bool = False, show_pc: bool = False, show_pid: bool = False,
        irq: bool = False, dma: bool = False,
    ) -> None:
        self.options = Options(compat, show_pc, show_pid, irq, dma)
        self.counts: dict[NgRecType, int] = dict.fromkeys(NgRecType, 0)
        self.lost = 0
        self.bad = 0
        self.untraced: list[str] = []
        # The columns the fast path reads: the checked ones (the timestamp
        # among them), the map id, then the format's other arguments in its
        # order.
        self._check = [
            access_column("hdr.type"),
            access_column("hdr.lost"),
            access_column("width", "I"),  # width, op, compat_width, compat_op
            access_column("hdr.ts_ns"),
        ]
        self._map_id = access_column("map_id")
        rest = ["phys", "compat_value" if compat else "value"]
        rest += ["ip", "pid"] if show_pc or show_pid else []
        self._rest = [access_column(name) for name in rest]
        self._formats = _fast_formats(self.options)
        # One access record at a time (feed): the same fields, in offset order.
        self._extended = show_pc or show_pid
        self._one = unpacker(
            NgRecAccess,
            ["hdr.ts_ns", "hdr.lost", "hdr.type", "phys", rest[1], "ip", "map_id", "pid"]
            + [("width", "I")],
        )

    def stats(self) -> dict[str, int]:
        out = {
            t.name.removeprefix("NG_REC_").lower(): n for t, n in self.counts.items()
        }
        out.update(lost=self.lost, bad=self.bad)
        return out

    def feed(self, raw: bytes | bytearray | memoryview) -> str:
        """Text for one raw record ("" for a bad one, which is counted)."""
        if len(raw) == _ACCESS_SIZE:
            text = self._one_access(raw)
            if text is not None:
                self.counts[_ACCESS] += 1
                return text
        try:
            rec = parse(raw)
            text = record_text(rec, self.options)
        except BadRecord:
            self.bad += 1
            return ""
        self.counts[NgRecType(rec.hdr.type)] += 1
        self.lost += rec.hdr.lost
        if isinstance(rec, NgRecUntraced):
            self.untraced.append(untraced_text(rec))
        return text

    def feed_batch(self, raws: Iterable[bytes | bytearray | memoryview]) -> str:
        """Text for many raw records, in order; same result as feed() on each."""
        image = ringbuf.pack(raws)
        text, used = self.feed_ring(memoryview(image))
        assert used == len(image)
        return text

    def feed_ring(
        self, view: memoryview, limit: int | None = None
    ) -> tuple[str, int]:
        """Text for the records in view, laid out as in a BPF ring buffer (see
        ringbuf), up to the first one still being written and at most about
        limit of them; and the bytes used.  Same text as feed() on each."""
        out: list[str] = []
        pos = done = 0
        end = len(view)
        left = limit if limit is not None else end  # records (there are fewer)
        words = view.cast("I")  # record headers
        short = _SHORT_RUN * (_ACCESS_STRIDE // 4)
        while pos < end and done < left:
            here = pos >> 2
            if words[here : here + short : _ACCESS_STRIDE // 4].tolist() == _SHORT_HEADS:
                rest = view[pos:]
                n = ringbuf.run_of(rest, _ACCESS_SIZE, min(_CHUNK, left - done))
                if n >= _SHORT_RUN:
                    out.append(self._run(rest[: n * _ACCESS_STRIDE], n))
                    pos += n * _ACCESS_STRIDE
                    done += n
                    continue
            rec = ringbuf.next_record(view, pos, words)
            if rec is None:
                break
            pos, raw = rec
            done += 1
            if raw is not None:
                out.append(self.feed(raw))
        return "".join(out), pos

    def _run(self, run: memoryview, n: int) -> str:
        """Text of n access-sized records one stride apart: in one chunk if
        the fast path takes them all, else stretch by stretch."""
        fine = self._chunk(run, n)
        if isinstance(fine, str):
            return fine
        out: list[str] = []
        i = 0
        for ok, group in groupby(fine):
            k = len(list(group))
            part = run[i * _ACCESS_STRIDE : (i + k) * _ACCESS_STRIDE]
            text = self._chunk(part, k) if ok and k >= _SHORT_RUN else None
            if isinstance(text, str):  # it is: all k are fine
                out.append(text)
            else:
                for j in range(ringbuf.HEADER, len(part), _ACCESS_STRIDE):
                    out.append(self.feed(part[j : j + _ACCESS_SIZE]))
            i += k
        return "".join(out)

    def _one_access(self, raw: bytes | bytearray | memoryview) -> str | None:
        """The line of an access record the fast path takes (see _chunk),
        without parsing it into a ctypes record; None for any other."""
        ts, lost, rtype, phys, value, ip, map_id, pid, opbytes = self._one.unpack(raw)
        fmt = self._formats.get(opbytes)
        if fmt is None or lost or rtype != _ACCESS or ts >= _FAST_TS_LIMIT:
            return None
        secs, usecs = divmod((ts + 500) // 1000, USEC_PER_SEC)
        if self._extended:
            return fmt % (secs, usecs, map_id, phys, value, ip, pid)
        return fmt % (secs, usecs, map_id, phys, value)

    # The hot path: n access records, one stride apart.  Each field is read
    # as a column (a strided memoryview), the conversions run in map(), and
    # one `%` formats the chunk: no Python code runs per record.  If some
    # record needs the slow path (lost > 0, an op or width not in the table,
    # an absurd timestamp), the result is instead a flag per record: whether
    # the fast path takes it.
    # Usually a chunk lies within one second and one mapping: then those two
    # numbers are written into its formats once instead of into every line.
    def _chunk(self, chunk: memoryview, n: int) -> str | list[bool]:
        views = {code: chunk.cast(code) for code in "HIiQ"}
        step = {code: _ACCESS_STRIDE // struct.calcsize(code) for code in views}

        def column(spec: tuple[str, int]) -> list[int]:
            code, first = spec
            return views[code][first :: step[code]].tolist()

        rtype, lost, opbytes, ts = map(column, self._check)
        formats, ops, last = self._formats, set(opbytes), max(ts)
        access = int(_ACCESS)
        if (
            rtype.count(access) != n
            or lost.count(0) != n
            or not formats.keys() >= ops
            or last >= _FAST_TS_LIMIT
        ):
            fine = map(
                and_,
                map(access.__eq__, rtype),
                map(and_, map(not_, lost), map(_FAST_TS_LIMIT.__gt__, ts)),
            )
            return list(map(and_, fine, map(formats.__contains__, opbytes)))
        self.counts[_ACCESS] += n
        map_ids = column(self._map_id)
        # ns2usecs(): microseconds rounded to nearest, then split at seconds
        secs = (min(ts) + 500) // NSEC_PER_SEC
        if (last + 500) // NSEC_PER_SEC == secs and map_ids.count(map_ids[0]) == n:
            head = f"{secs}.%06u {map_ids[0]} "
            formats = {op: formats[op].replace(_HEAD, head, 1) for op in ops}
            base = 500 - secs * NSEC_PER_SEC
            cols = [map(floordiv, map(add, ts, repeat(base)), repeat(1000))]
        else:
            usecs = list(map(floordiv, map(add, ts, repeat(500)), repeat(1000)))
            cols = [
                map(floordiv, usecs, repeat(USEC_PER_SEC)),
                map(mod, usecs, repeat(USEC_PER_SEC)),
                map_ids,
            ]
        cols += map(column, self._rest)
        # the arguments record by record: column i fills every len(cols)-th slot
        args: list[int] = [0] * (len(cols) * n)
        for i, col in enumerate(cols):
            args[i :: len(cols)] = col
        if len(ops) == 1:  # a polling loop, say: one op and width throughout
            text = formats[opbytes[0]] * n
        else:
            text = "".join(map(formats.__getitem__, opbytes))
        return text % tuple(args)
