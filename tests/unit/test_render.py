"""render.py against the kernel: the verbatim reference streams in
tests/reference (or $MMIOTNG_REFERENCE) and an oracle built here from the
C format strings of kernel/trace/trace_mmiotrace.c, formatted by a small
emulation of C printf (argument widths and signedness as the C types say).
"""

from __future__ import annotations

import ctypes
import os
import random
import re
from pathlib import Path

import pytest
from ng_require import missing

from mmiotrace_ng.format import render
from mmiotrace_ng.format.abi import MMIOTNG_OP_WRITE
from mmiotrace_ng.format.records import (
    NG_MARK_MAX,
    NgRecAccess,
    NgRecDma,
    NgRecHdr,
    NgRecIrq,
    NgRecMap,
    NgRecMark,
    NgRecType,
    NgRecUnmap,
    NgRecUntraced,
)
from mmiotrace_ng.format.render import ENCODING, ERRORS, Options, Renderer

REPO = Path(__file__).resolve().parents[2]

REFERENCE = Path(os.environ.get("MMIOTNG_REFERENCE", REPO / "tests" / "reference"))
# --- the kernel's format strings, verbatim (Linux 6.1) -----------------------
# kernel/trace/trace_mmiotrace.c
C_PCIDEV = "PCIDEV %02x%02x %04x%04x %x"  # l. 68, then " %llx" x7 (l. 73), x7 (l. 80)
C_PCIDEV_NUM = " %llx"
C_PCIDEV_DRV = " %s\n"  # l. 85
C_PCIDEV_NODRV = " \n"  # l. 87
C_VERSION = "VERSION 20070824\n"  # l. 103
C_LOST = "MARK 0.000000 Lost %lu events.\n"  # l. 142
C_R = "R %d %u.%06lu %d 0x%llx 0x%lx 0x%lx %d\n"  # l. 181
C_W = "W %d %u.%06lu %d 0x%llx 0x%lx 0x%lx %d\n"  # l. 188
C_UNKNOWN = "UNKNOWN %u.%06lu %d 0x%llx %02lx,%02lx,%02lx 0x%lx %d\n"  # l. 195-196
C_MAP = "MAP %u.%06lu %d 0x%llx 0x%lx 0x%lx 0x%lx %d\n"  # l. 226
C_UNMAP = "UNMAP %u.%06lu %d 0x%lx %d\n"  # l. 233
C_MARK = "MARK %u.%06lu %s"  # l. 255
# drivers/pci/proc.c show_device()
C_PROC_HEAD = "%02x%02x\t%04x%04x\t%x"  # l. 392
C_PROC_NUM = "\t%16llx"  # l. 403, l. 410

_SPEC = re.compile(r"%(?P<zero>0?)(?P<width>\d*)(?P<len>ll|l|)(?P<conv>[duxs%])")


def c_printf(fmt: str, *args: int | str) -> str:
    """printf for the conversions the kernel uses here, on x86-64: no length
    modifier = 32-bit int, l/ll = 64-bit; d signed, u/x unsigned."""
    out: list[str] = []
    pos = 0
    rest = list(args)
    for m in _SPEC.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        if m["conv"] == "%":
            out.append("%")
            continue
        arg = rest.pop(0)
        if m["conv"] == "s":
            assert isinstance(arg, str)
            s = arg
        else:
            assert isinstance(arg, int)
            bits = 64 if m["len"] else 32
            v = arg & ((1 << bits) - 1)
            if m["conv"] == "d" and v >> (bits - 1):
                v -= 1 << bits
            s = format(v, "x" if m["conv"] == "x" else "d")
        if m["width"]:
            s = s.rjust(int(m["width"]), "0" if m["zero"] else " ")
        out.append(s)
    assert not rest, "more arguments than conversions"
    out.append(fmt[pos:])
    return "".join(out)


def kernel_time(ns: int) -> tuple[int, int]:
    """ns2usecs() (trace.c: nsec += 500; do_div(nsec, 1000), u64), then
    usec_rem = do_div(t, USEC_PER_SEC); secs = (unsigned long)t (printed %u)."""
    t = ((ns + 500) % (1 << 64)) // 1000
    return t // 1_000_000, t % 1_000_000


# --- oracle --------------------------------------------------------------------


# What the stream says of a mapping the helper did not arm (errno -> words).
C_UNTRACED = ("MARK %u.%06lu mmiotrace-ng: ioremap of 0x%llx size 0x%llx at 0x%llx "
              "is NOT traced: %s\n")
UNTRACED_WORDS = {-2: "it is not inside one traced BAR", -12: "the helper ran out of memory"}


def oracle(rec: NgRecAccess | NgRecMap | NgRecUnmap | NgRecMark | NgRecUntraced | NgRecIrq
           | NgRecDma, opts: Options) -> str:
    """What the stream must hold for one record, from the C formats above."""
    text = c_printf(C_LOST, rec.hdr.lost) if rec.hdr.lost else ""
    secs, usecs = kernel_time(rec.hdr.ts_ns)
    pid = rec.pid if opts.show_pid else 0
    if isinstance(rec, NgRecAccess):
        pc = rec.ip if opts.show_pc else 0
        if opts.compat:
            op, width, value = rec.compat_op, rec.compat_width, rec.compat_value
            # arch/x86/mm/mmio-mod.c pre(): value = ip[0] << 16 | ip[1] << 8 | ip[2]
            b = [(value >> 16) & 0xFF, (value >> 8) & 0xFF, value & 0xFF]
        else:
            op, width, value = rec.op, rec.width, rec.value
            b = list(rec.insn[:3])
        if op == 0:
            line = c_printf(
                C_R, width, secs, usecs, rec.map_id, rec.phys, value, pc, pid
            )
        elif op == 1:
            line = c_printf(
                C_W, width, secs, usecs, rec.map_id, rec.phys, value, pc, pid
            )
        else:
            line = c_printf(C_UNKNOWN, secs, usecs, rec.map_id, rec.phys, *b, pc, pid)
    elif isinstance(rec, NgRecMap):
        pc = rec.ip if opts.show_pc and not opts.compat else 0
        line = c_printf(
            C_MAP, secs, usecs, rec.map_id, rec.phys, rec.virt, rec.len, pc, pid
        )
    elif isinstance(rec, NgRecUnmap):
        pc = rec.ip if opts.show_pc and not opts.compat else 0
        line = c_printf(C_UNMAP, secs, usecs, rec.map_id, pc, pid)
    elif isinstance(rec, NgRecUntraced):
        line = c_printf(C_UNTRACED, secs, usecs, rec.phys, rec.len, rec.virt,
                        UNTRACED_WORDS[rec.err])
    elif isinstance(rec, NgRecIrq):
        # a MARK line of the words docs/tracing.md gives, with --irq only
        what = ("enter " + rec.handler.decode() if not rec.exit else
                "exit " + {0: "none", 1: "handled", 2: "wake-thread",
                           3: "handled+wake-thread"}[rec.ret & 3])
        line = (c_printf(C_MARK, secs, usecs, f"irq {rec.irq} {rec.dev.decode()} {what}\n")
                if opts.irq else "")
    elif isinstance(rec, NgRecDma):
        # the words of docs/tracing.md, with --dma only
        kind = ["map", "unmap", "alloc", "free", "map-sg", "unmap-sg"][rec.kind]
        way = ["bidirectional", "to-device", "from-device", "none"][rec.dir]
        line = (c_printf(C_MARK, secs, usecs,
                         f"dma {kind} {rec.dev.decode()} 0x{rec.addr:x} {rec.size} {way}\n")
                if opts.dma else "")
    else:
        # tracing_mark_write(): buf[cnt] = '\n' unless buf[cnt - 1] == '\n'
        msg = bytes(rec)[NgRecMark.text.offset :][: rec.len]
        if not msg.endswith(b"\n"):
            msg += b"\n"
        msg = msg[: msg.index(b"\0")] if b"\0" in msg else msg  # %s
        line = c_printf(C_MARK, secs, usecs, msg.decode(ENCODING, ERRORS))
    return text + line


# --- record builders -----------------------------------------------------------


def acc(
    ts: int, op: int, width: int, map_id: int, phys: int, value: int, **kw: int
) -> NgRecAccess:
    rec = NgRecAccess(phys=phys, value=value, compat_value=value, map_id=map_id)
    rec.hdr.type, rec.hdr.ts_ns = NgRecType.NG_REC_ACCESS, ts
    rec.op = rec.compat_op = op
    rec.width = rec.compat_width = width
    for k, v in kw.items():
        if k in ("lost", "cpu"):
            setattr(rec.hdr, k, v)
        else:
            setattr(rec, k, v)
    return rec


def mapr(
    ts: int, map_id: int, phys: int, virt: int, length: int, **kw: int
) -> NgRecMap:
    rec = NgRecMap(phys=phys, virt=virt, len=length, map_id=map_id, **kw)
    rec.hdr.type, rec.hdr.ts_ns = NgRecType.NG_REC_MAP, ts
    return rec


def unmapr(ts: int, map_id: int, **kw: int) -> NgRecUnmap:
    rec = NgRecUnmap(map_id=map_id, **kw)
    rec.hdr.type, rec.hdr.ts_ns = NgRecType.NG_REC_UNMAP, ts
    return rec


def markr(ts: int, text: bytes, *, lost: int = 0) -> NgRecMark:
    rec = NgRecMark(len=len(text))
    rec.hdr.type, rec.hdr.ts_ns, rec.hdr.lost = NgRecType.NG_REC_MARK, ts, lost
    ctypes.memmove(ctypes.addressof(rec) + NgRecMark.text.offset, text, len(text))
    return rec


def irqr(ts: int, irq: int, exit_: int, ret: int = 0, lost: int = 0) -> bytes:
    rec = NgRecIrq(irq=irq, pid=7, exit=exit_, ret=ret, dev=b"0000:00:05.0",
                   handler=b"edu_exerciser")
    rec.hdr.type, rec.hdr.ts_ns, rec.hdr.lost = NgRecType.NG_REC_IRQ, ts, lost
    return bytes(rec)


def raw_mark(rec: NgRecMark) -> bytes:
    """As the BPF side may submit it: only up to the end of the text."""
    return bytes(rec)[: NgRecMark.text.offset + rec.len]


# --- reference streams ---------------------------------------------------------


def reference(name: str) -> list[str]:
    path = REFERENCE / name
    if not path.exists():
        missing(f"{path} not present")
    text = path.read_bytes().decode()
    return [line for line in text.splitlines(keepends=True) if not line.startswith("#")]


def ts_of(stamp: str, extra_ns: int) -> int:
    """A ns timestamp that the kernel prints as `stamp` (extra_ns in -500..499)."""
    secs, usecs = stamp.split(".")
    return (int(secs) * 1_000_000 + int(usecs)) * 1000 + extra_ns


def record_for_line(
    line: str, extra_ns: int
) -> NgRecAccess | NgRecMap | NgRecUnmap | NgRecMark:
    """A record holding the values of one reference line (pc and pid are 0 in
    the references, so the record gets a nonzero ip/pid that must not show)."""
    f = line.split(" ")
    kind = f[0]
    if kind in ("R", "W"):
        return acc(
            ts_of(f[2], extra_ns), "RW".index(kind), int(f[1]), int(f[3]),
            int(f[4], 16), int(f[5], 16), ip=0xFFFFFFFFC0DE0000, pid=1234,
        )  # fmt: skip
    if kind == "MAP":
        return mapr(
            ts_of(f[1], extra_ns), int(f[2]), int(f[3], 16), int(f[4], 16),
            int(f[5], 16), ip=0xFFFFFFFFC0DE0000, pid=1234,
        )  # fmt: skip
    if kind == "UNMAP":
        return unmapr(ts_of(f[1], extra_ns), int(f[2]), ip=0xFFFFFFFFC0DE0000, pid=1)
    if kind == "MARK":
        text = line.split(" ", 2)[2]
        return markr(ts_of(f[1], extra_ns), text.rstrip("\n").encode())  # newline added
    raise AssertionError(f"unexpected reference line {line!r}")


def proc_devices_for(pcidev: list[str]) -> str:
    """/proc/bus/pci/devices as drivers/pci/proc.c show_device() would print
    it for the devices of these PCIDEV lines (same numbers, other layout)."""
    out = []
    for line in pcidev:
        assert line.endswith("\n")
        f = line[:-1].split(" ", 18)  # PCIDEV, 3 ids, 14 numbers, driver ("" if none)
        assert f[0] == "PCIDEV" and len(f) == 19
        busdevfn, vendev, irq, *nums = (int(x, 16) for x in f[1:18])
        text = c_printf(
            C_PROC_HEAD,
            busdevfn >> 8,
            busdevfn & 0xFF,
            vendev >> 16,
            vendev & 0xFFFF,
            irq,
        )
        text += "".join(c_printf(C_PROC_NUM, n) for n in nums)
        out.append(text + "\t" + f[18] + "\n")  # seq_putc '\t', seq_puts name, '\n'
    return "".join(out)


# --- tests ---------------------------------------------------------------------


def test_format_strings_transcribed_verbatim(kernel_source: Path) -> None:
    src = kernel_source / "kernel/trace/trace_mmiotrace.c"
    proc_c = kernel_source / "drivers/pci/proc.c"
    code = src.read_text()
    for fmt in (
        C_PCIDEV,
        C_PCIDEV_NUM,
        C_VERSION,
        C_LOST,
        C_R,
        C_W,
        C_MAP,
        C_UNMAP,
        C_MARK,
    ):
        c_literal = fmt.replace("\n", "\\n")
        assert f'"{c_literal}"' in code, fmt
    assert (
        '"UNKNOWN %u.%06lu %d 0x%llx %02lx,%02lx,"\n\t\t\t"%02lx 0x%lx %d\\n"' in code
    )
    proc = proc_c.read_text()
    assert '"%02x%02x\\t%04x%04x\\t%x"' in proc and '"\\t%16llx"' in proc


def test_c_printf_emulation() -> None:
    assert c_printf("%u.%06lu", (1 << 32) + 7, 42) == "7.000042"
    assert c_printf("%d 0x%llx 0x%lx", -1, 1 << 40, 0) == "-1 0x10000000000 0x0"
    assert c_printf("%02lx,%02lx", 0x8B, 5) == "8b,05"
    assert c_printf("\t%16llx", 0xFEA00000) == "\t        fea00000"


def test_version_line() -> None:
    assert render.VERSION_LINE == C_VERSION
    assert reference("edu-kernel-mmiotrace.txt")[0] == render.VERSION_LINE


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0.000000"),
        (499, "0.000000"),
        (500, "0.000001"),
        (999_999_499, "0.999999"),
        (999_999_500, "1.000000"),
        (27_262_255_000, "27.262255"),
        ((1 << 32) * 10**9 + 5_000_000_000, "5.000000"),  # secs is a 32-bit %u
        ((1 << 64) - 1, "0.000000"),  # ns + 500 wraps in u64
    ],
)
def test_timestamps(ns: int, text: str) -> None:
    secs, usecs = render.ts_parts(ns)
    assert f"{secs}.{usecs:06}" == text == c_printf("%u.%06lu", *kernel_time(ns))


def test_pcidev_lines_match_reference() -> None:
    pcidev = [
        line
        for line in reference("edu-kernel-mmiotrace.txt")
        if line.startswith("PCIDEV ")
    ]
    assert len(pcidev) == 13
    proc = proc_devices_for(pcidev)
    assert "\t    ff54" not in proc and "\t        fea00000\t" in proc
    assert render.pcidev_lines(proc) == pcidev
    assert render.stream_header(proc) == C_VERSION + "".join(pcidev)


def test_pcidev_without_trailing_tab_and_malformed() -> None:
    fields = (
        [0x00, 0x20, 0x1234, 0x11E8, 0xA]
        + [0xFEA00000]
        + [0] * 6
        + [0x100000]
        + [0] * 6
    )
    head = c_printf(C_PROC_HEAD, *fields[:5])
    line = head + "".join(c_printf(C_PROC_NUM, n) for n in fields[5:])
    want = c_printf(C_PCIDEV, *fields[:5])
    want += "".join(c_printf(C_PCIDEV_NUM, n) for n in fields[5:]) + C_PCIDEV_NODRV
    assert render.pcidev_lines(line + "\n") == [want]
    assert render.pcidev_lines(line + "\tedu\n\n") == [
        want[:-2] + c_printf(C_PCIDEV_DRV, "edu")
    ]
    with pytest.raises(ValueError, match="line 2"):
        render.pcidev_lines(line + "\n" + line.replace("fea00000", "zzzzzzzz"))
    with pytest.raises(ValueError, match="line 1"):
        render.pcidev_lines("0020\t123411e8\ta\n")


@pytest.mark.parametrize("extra_ns", [-500, 0, 499])
@pytest.mark.parametrize(
    "name", ["edu-kernel-mmiotrace.txt", "e1000-kernel-mmiotrace-excerpt.txt"]
)
def test_reference_stream_records(name: str, extra_ns: int) -> None:
    lines = reference(name)
    assert lines[0] == C_VERSION
    body = [line for line in lines[1:] if not line.startswith("PCIDEV ")]
    recs = [record_for_line(line, extra_ns) for line in body]
    raws = [raw_mark(r) if isinstance(r, NgRecMark) else bytes(r) for r in recs]
    for compat in (False, True):
        renderer = Renderer(compat=compat)
        assert renderer.feed_batch(raws) == "".join(body)
        assert [Renderer(compat=compat).feed(raw) for raw in raws] == body
        assert renderer.bad == 0 and renderer.lost == 0
        assert sum(renderer.counts.values()) == len(body)


def test_whole_edu_stream() -> None:
    lines = reference("edu-kernel-mmiotrace.txt")
    pcidev = [line for line in lines if line.startswith("PCIDEV ")]
    body = lines[1 + len(pcidev) :]
    raws = []
    for line in body:
        rec = record_for_line(line, 123)
        raws.append(raw_mark(rec) if isinstance(rec, NgRecMark) else bytes(rec))
    stream = render.stream_header(proc_devices_for(pcidev)) + Renderer().feed_batch(raws)
    want = b"".join(line.encode() for line in lines)
    assert stream.encode(ENCODING, ERRORS) == want
    assert want.endswith(b"MARK 27.430042 hello\n")


def test_compat_and_native_differ_as_specified() -> None:
    # kernel could not decode (e.g. a rep movs): it prints UNKNOWN with the first
    # three instruction bytes; the helper decoded a 4-byte read
    rec = acc(1_000_000_000, 0, 4, 2, 0xFEB80010, 0x1C8, ip=0xFFFFFFFF81234567, pid=77)
    rec.compat_op, rec.compat_width, rec.compat_value = 2, 0, 0xF3A500
    native = render.access_line(rec, Options())
    compat = render.access_line(rec, Options(compat=True))
    assert (
        native
        == c_printf(C_R, 4, 1, 0, 2, 0xFEB80010, 0x1C8, 0, 0)
        == "R 4 1.000000 2 0xfeb80010 0x1c8 0x0 0\n"
    )
    assert compat == c_printf(C_UNKNOWN, 1, 0, 2, 0xFEB80010, 0xF3, 0xA5, 0x00, 0, 0)
    assert compat == "UNKNOWN 1.000000 2 0xfeb80010 f3,a5,00 0x0 0\n"
    shown = render.access_line(rec, Options(compat=True, show_pc=True, show_pid=True))
    assert shown == c_printf(
        C_UNKNOWN, 1, 0, 2, 0xFEB80010, 0xF3, 0xA5, 0, 0xFFFFFFFF81234567, 77
    )


def test_native_unknown_uses_instruction_bytes() -> None:
    rec = acc(2_500_000_000, 2, 0, 1, 0xFEA00000, 0)
    rec.insn[:4] = [0x66, 0x0F, 0x7F, 0x00]
    rec.insn_len = 4
    assert render.access_line(rec) == c_printf(
        C_UNKNOWN, 2, 500000, 1, 0xFEA00000, 0x66, 0x0F, 0x7F, 0, 0
    )


def test_pc_and_pid_options() -> None:
    r = acc(5, 1, 8, 3, 0x1000, (1 << 64) - 1, ip=0xFFFFFFFFA0000010, pid=4242)
    m = mapr(5, 3, 0x1000, 0xFFFFC90000000000, 0x20, ip=0xFFFFFFFFA0000020, pid=4242)
    u = unmapr(5, -1, ip=0xFFFFFFFFA0000030, pid=4242)
    for opts in (
        Options(c, pc, pid)
        for c in (False, True)
        for pc in (False, True)
        for pid in (False, True)
    ):
        for rec in (r, m, u):
            assert render.record_text(rec, opts) == oracle(rec, opts), opts
    assert render.access_line(r) == "W 8 0.000000 3 0x1000 0xffffffffffffffff 0x0 0\n"
    assert (
        render.unmap_line(u, Options(show_pc=True))
        == "UNMAP 0.000000 -1 0xffffffffa0000030 0\n"
    )
    # the kernel's trace_pc=1 shows pc in R/W/UNKNOWN but never in MAP/UNMAP
    assert render.map_line(m, Options(compat=True, show_pc=True)).endswith(" 0x0 0\n")


def test_lost_marker() -> None:
    rec = acc(3_000_000_000, 0, 4, 1, 0xFEA00000, 7, lost=12)
    want = c_printf(C_LOST, 12) + c_printf(C_R, 4, 3, 0, 1, 0xFEA00000, 7, 0, 0)
    assert want.startswith("MARK 0.000000 Lost 12 events.\nR 4 3.000000 ")
    r = Renderer()
    assert r.feed(bytes(rec)) == want
    assert r.feed_batch([bytes(rec)]) == want
    mark = markr(4_000_000_000, b"x\n", lost=1)
    assert r.feed(raw_mark(mark)) == c_printf(C_LOST, 1) + "MARK 4.000000 x\n"
    assert r.lost == 12 + 12 + 1
    assert (
        r.counts[NgRecType.NG_REC_ACCESS] == 2 and r.counts[NgRecType.NG_REC_MARK] == 1
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (b"hello\n", "hello\n"),
        (b"hello", "hello\n"),  # trace_marker adds the newline
        (b"two\nlines", "two\nlines\n"),
        (b"", "\n"),
        (b"ab\0cd", "ab"),  # newline appended after "cd", but %s stops at the NUL
        (b"ab\0cd\n", "ab"),
        (b"x" * NG_MARK_MAX, "x" * NG_MARK_MAX + "\n"),
    ],
)
def test_mark_text(text: bytes, shown: str) -> None:
    rec = markr(27_430_042_000, text)
    want = "MARK 27.430042 " + shown
    assert render.mark_line(rec) == want == oracle(rec, Options())
    assert Renderer().feed(raw_mark(rec)) == want
    assert Renderer().feed(bytes(rec)) == want


def test_mark_bytes_survive() -> None:
    text = "é \udcff".encode(ENCODING, ERRORS)  # valid UTF-8 and a stray 0xff
    assert text == b"\xc3\xa9 \xff"
    out = render.mark_line(markr(1, text + b"\n"))
    assert out.encode(ENCODING, ERRORS) == b"MARK 0.000000 \xc3\xa9 \xff\n"


def random_records(n: int, seed: int) -> list[bytes]:
    """A mix that hits both the fast and the slow path, and bad records."""
    rng = random.Random(seed)
    raws = []
    ts = 10**9
    for i in range(n):
        ts += rng.randrange(0, 3000)
        roll = rng.random()
        if roll < 0.7:
            op, cop = rng.choice([0, 1, 2]), rng.choice([0, 1, 2])
            rec = acc(
                ts if rng.random() > 0.01 else rng.choice([(1 << 64) - 1, (1 << 32) * 10**9 + 123]),
                op, rng.choice([1, 2, 4, 8, 0, 3, 16]), rng.randrange(-1, 5),
                rng.getrandbits(rng.choice([32, 64])), rng.getrandbits(rng.choice([8, 32, 64])),
                ip=rng.getrandbits(64), pid=rng.randrange(0, 1 << 22),
                lost=rng.choice([0] * 20 + [1, 1000]), cpu=rng.randrange(4),
            )  # fmt: skip
            rec.compat_op, rec.compat_width = cop, rng.choice([0, 1, 2, 4, 8])
            rec.compat_value = rng.getrandbits(32)
            rec.insn[:] = list(rng.randbytes(8))
            raw = bytes(rec)
        elif roll < 0.8:
            raw = bytes(
                mapr(
                    ts,
                    i,
                    rng.getrandbits(40),
                    rng.getrandbits(64),
                    rng.getrandbits(20),
                    ip=i,
                    pid=i,
                )
            )
        elif roll < 0.85:
            raw = bytes(unmapr(ts, rng.randrange(-1, 9), ip=i, pid=i))
        elif roll < 0.87:
            raw = bytes(NgRecUntraced(hdr=NgRecHdr(ts_ns=ts, type=NgRecType.NG_REC_UNTRACED,
                                                   lost=rng.choice([0, 0, 3])),
                                      phys=rng.getrandbits(40), virt=rng.getrandbits(64),
                                      len=rng.getrandbits(20), err=rng.choice([-2, -12]),
                                      pid=i))
        elif roll < 0.89:
            raw = irqr(ts, rng.randrange(1 << 32), rng.randrange(2), rng.randrange(4),
                       lost=rng.choice([0, 0, 2]))
        elif roll < 0.91:
            rec = NgRecDma(addr=rng.getrandbits(64), size=rng.getrandbits(32),
                           phys=rng.getrandbits(40), pid=i, kind=rng.randrange(6),
                           dir=rng.randrange(4), dev=b"0000:01:00.0")
            rec.hdr.type, rec.hdr.ts_ns = NgRecType.NG_REC_DMA, ts
            rec.hdr.lost = rng.choice([0, 0, 4])
            raw = bytes(rec)
        elif roll < 0.94:
            raw = raw_mark(
                markr(
                    ts, rng.randbytes(rng.randrange(0, 40)), lost=rng.choice([0, 0, 5])
                )
            )
        else:
            good = bytes(acc(ts, 0, 4, 1, 0, 0))
            raw = rng.choice(
                [
                    good[: rng.randrange(0, len(good))],
                    good[:12] + b"\x09\x00" + good[14:],
                    b"",
                ]
            )
        if roll < 0.94 and rng.random() < 0.05:
            raw += bytes(rng.randrange(1, 8))  # perf-buffer padding
        raws.append(raw)
    return raws


@pytest.mark.parametrize("compat", [False, True])
@pytest.mark.parametrize(
    ("show_pc", "show_pid"),
    [(False, False), (True, False), (False, True), (True, True)],
)
@pytest.mark.parametrize("irq", [False, True])   # and --dma
def test_batch_equals_oracle(compat: bool, show_pc: bool, show_pid: bool, irq: bool) -> None:
    from mmiotrace_ng.format.records import BadRecord, parse

    opts = Options(compat, show_pc, show_pid, irq, dma=irq)
    raws = random_records(3000, seed=hash((compat, show_pc, show_pid, irq)) & 0xFFFF)
    want: list[str] = []
    bad = lost = 0
    counts = dict.fromkeys(NgRecType, 0)
    for raw in raws:
        try:
            rec = parse(raw)
        except BadRecord:
            bad += 1
            continue
        want.append(oracle(rec, opts))
        lost += rec.hdr.lost
        counts[NgRecType(rec.hdr.type)] += 1
    assert bad > 0 and lost > 0 and all(counts.values())
    batch = Renderer(compat, show_pc, show_pid, irq, dma=irq)
    assert batch.feed_batch(iter(raws)) == "".join(want)
    assert (batch.bad, batch.lost, batch.counts) == (bad, lost, counts)
    single = Renderer(compat, show_pc, show_pid, irq, dma=irq)
    assert "".join(single.feed(raw) for raw in raws) == "".join(want)
    assert (single.bad, single.lost, single.counts) == (bad, lost, counts)
    assert single.stats() == {
        "map": counts[NgRecType.NG_REC_MAP],
        "unmap": counts[NgRecType.NG_REC_UNMAP],
        "access": counts[NgRecType.NG_REC_ACCESS],
        "mark": counts[NgRecType.NG_REC_MARK],
        "untraced": counts[NgRecType.NG_REC_UNTRACED],
        "irq": counts[NgRecType.NG_REC_IRQ],
        "dma": counts[NgRecType.NG_REC_DMA],
        "lost": lost,
        "bad": bad,
    }
    # what the stream says of each mapping that is not traced, for stderr too
    assert len(single.untraced) == counts[NgRecType.NG_REC_UNTRACED]


def test_batch_keeps_percent_signs_of_marks() -> None:
    """Slow-path text enters the chunk's format as an argument, never as a
    format: a marker holding % directives comes out verbatim."""
    text = b"50% done %d %s %%\n"
    raws = [bytes(acc(1000, 0, 4, 1, 0, 0)), raw_mark(markr(2000, text))]
    raws.append(bytes(acc(3000, 1, 4, 1, 0, 0)))
    out = Renderer().feed_batch(raws)
    assert out.splitlines()[1] == "MARK 0.000002 " + text.decode().rstrip("\n")
    assert out == "".join(Renderer().feed(raw) for raw in raws)


# --- rendering straight from ring-buffer memory ---------------------------------


def long_runs(n: int, seed: int) -> list[bytes]:
    """Valid access records in long runs (the fast path): in blocks of 1024,
    the first crossing a second, then by turns one mapping, mixed mappings,
    and a block with timestamps on the rounding edges and now and then a
    record the fast path must leave to the slow one."""
    rng = random.Random(seed)
    ts = 7 * 10**9 - 3_000_000
    out = []
    for i in range(n):
        block = i // 1024
        faulty = block % 3 == 2
        ts += rng.choice([1, 499, 500, 1000, 2345, 40_000])
        stamp = ts
        if faulty and rng.random() < 0.05:  # just below / at a rounding edge
            stamp = rng.randrange(1, 50) * 10**9 - rng.choice([499, 500, 501])
        map_id = rng.choice([1, 2, -1]) if block % 3 == 1 and block > 1 else 1
        op, width = i & 1, rng.choice([1, 2, 4, 8])
        value = rng.getrandbits(8 * width)
        rec = acc(stamp, op, width, map_id, 0xFEA0_0000 + 4 * rng.randrange(64), value,
                  ip=rng.getrandbits(64), pid=rng.randrange(1 << 22))  # fmt: skip
        rec.compat_value = rng.getrandbits(32)
        rec.compat_width = rng.choice([1, 2, 4])
        roll = rng.random() if faulty else 1.0
        if roll < 0.002:
            rec.hdr.lost = 3
        elif roll < 0.004:
            rec.op = rec.compat_op = 2  # UNKNOWN
        elif roll < 0.005:
            rec.width = 3
        elif roll < 0.006:
            rec.hdr.ts_ns = (1 << 64) - 1
        elif roll < 0.007:
            out.append(raw_mark(markr(stamp, b"100% %s\n")))
            continue
        out.append(bytes(rec))
    return out


def oracle_text(raws: list[bytes], opts: Options) -> str:
    from mmiotrace_ng.format.records import parse

    return "".join(oracle(parse(raw), opts) for raw in raws)


@pytest.mark.parametrize("compat", [False, True])
@pytest.mark.parametrize("show_pc,show_pid", [(False, False), (True, False), (True, True)])
def test_ring_fast_path_equals_oracle(compat: bool, show_pc: bool, show_pid: bool) -> None:
    from mmiotrace_ng.common import ringbuf

    raws = long_runs(6000, seed=7)
    image = ringbuf.pack(raws)
    r = Renderer(compat, show_pc, show_pid)
    text, used = r.feed_ring(memoryview(image))
    assert used == len(image)
    assert text == oracle_text(raws, Options(compat, show_pc, show_pid))
    assert sum(r.counts.values()) == len(raws) and r.bad == 0
    assert r.lost == 3 * text.count("Lost 3 events") > 0


def test_ring_fast_path_cases_hit() -> None:
    """long_runs() exercises both branches of the fast path (one second and
    one mapping per chunk, or not) and the slow path."""
    raws = long_runs(6000, seed=7)
    r = Renderer()
    calls = {"fast": 0, "refused": 0}
    chunk = r._chunk

    def counting(view: memoryview, n: int) -> str | list[bool]:
        out = chunk(view, n)
        calls["fast" if isinstance(out, str) else "refused"] += 1
        return out

    r._chunk = counting  # type: ignore[method-assign]
    from mmiotrace_ng.common import ringbuf

    r.feed_ring(memoryview(ringbuf.pack(raws)))
    assert calls["fast"] >= 3 and calls["refused"] >= 1
    assert r.counts[NgRecType.NG_REC_ACCESS] > 5000


def test_ring_stops_at_a_record_being_written_and_skips_discarded() -> None:
    from mmiotrace_ng.common import ringbuf

    raws = long_runs(3000, seed=3)
    image = bytearray(ringbuf.pack(raws))
    offsets = []
    pos = 0
    for raw in raws:
        offsets.append(pos)
        pos += ringbuf.stride(len(raw))
    image[offsets[1200] + 3] |= ringbuf.DISCARD >> 24
    image[offsets[2500] + 3] |= ringbuf.BUSY >> 24
    r = Renderer()
    text, used = r.feed_ring(memoryview(image))
    assert used == offsets[2500]
    kept = raws[:1200] + raws[1201:2500]
    assert text == oracle_text(kept, Options())
    assert sum(r.counts.values()) == len(kept)


@pytest.mark.parametrize("every", [1, 2, 3, 700])
def test_ring_refused_records_are_looked_at_a_bounded_number_of_times(every: int) -> None:
    """Records the fast path refuses (UNKNOWN ops, as --compat gives for
    string instructions, or lost > 0) do not make it look at the rest of
    their run again and again: the chunks it is given add up to at most
    twice the records."""
    from mmiotrace_ng.common import ringbuf

    raws = []
    for i in range(5000):
        rec = acc(10**9 + 1000 * i, 0, 4, 1, 0xFEA0_0000, i)
        if i % every == 0:
            rec.op = rec.compat_op = 2
        if i % (every * 2) == 1:
            rec.hdr.lost = 1
        raws.append(bytes(rec))
    r = Renderer()
    seen = []
    chunk = r._chunk

    def counting(view: memoryview, n: int) -> str | list[bool]:
        seen.append(n)
        return chunk(view, n)

    r._chunk = counting  # type: ignore[method-assign]
    text, _ = r.feed_ring(memoryview(ringbuf.pack(raws)))
    assert text == oracle_text(raws, Options())
    assert sum(seen) <= 2 * len(raws)


def test_interrupts_are_mark_lines_with_irq_only() -> None:
    """--irq: a handler's entry and exit as MARK lines, its result named;
    without it nothing of them but a loss they carry, and the accesses'
    lines the same either way."""
    a = [bytes(acc(1_000_000_000 + i, MMIOTNG_OP_WRITE, 4, 1, 0xfe000060, 1)) for i in range(5)]
    raws = [a[0], irqr(1_000_002_000, 24, 0), *a[1:3], irqr(1_000_009_400, 24, 1, 1),
            irqr(2_000_000_000, 25, 0), irqr(2_000_001_000, 25, 1, 0, lost=3),
            irqr(2_000_002_000, 25, 1, 3), *a[3:]]
    with_irq = Renderer(irq=True).feed_batch(raws)
    plain = Renderer().feed_batch(raws)
    irq_lines = [ln for ln in with_irq.splitlines() if " irq " in ln]
    assert irq_lines == [
        "MARK 1.000002 irq 24 0000:00:05.0 enter edu_exerciser",
        "MARK 1.000009 irq 24 0000:00:05.0 exit handled",
        "MARK 2.000000 irq 25 0000:00:05.0 enter edu_exerciser",
        "MARK 2.000001 irq 25 0000:00:05.0 exit none",
        "MARK 2.000002 irq 25 0000:00:05.0 exit handled+wake-thread",
    ]
    assert plain == "".join(ln for ln in with_irq.splitlines(keepends=True)
                            if " irq " not in ln)
    assert plain.count("Lost 3 events") == 1
    r = Renderer()
    r.feed_batch(raws)
    assert r.stats()["irq"] == 5 and r.stats()["access"] == 5


def test_dma_mappings_are_mark_lines_with_dma_only() -> None:
    """--dma: a mapping's kind, device, bus address, size and direction in
    a MARK line; without it nothing but the loss the record carries."""
    def dmar(ts: int, kind: int, addr: int, size: int, way: int, lost: int = 0) -> bytes:
        rec = NgRecDma(addr=addr, size=size, phys=0x1234000, pid=1, kind=kind, dir=way,
                       dev=b"0000:00:05.0")
        rec.hdr.type, rec.hdr.ts_ns, rec.hdr.lost = NgRecType.NG_REC_DMA, ts, lost
        return bytes(rec)

    raws = [dmar(3_000_000_000, 0, 0x1f3a000, 4096, 1),
            dmar(3_000_500_000, 1, 0x1f3a000, 4096, 1),
            dmar(3_001_000_000, 2, 0x100000, 65536, 0, lost=2),
            dmar(3_002_000_000, 5, 0x2000, 512, 2)]
    assert Renderer(dma=True).feed_batch(raws).splitlines() == [
        "MARK 3.000000 dma map 0000:00:05.0 0x1f3a000 4096 to-device",
        "MARK 3.000500 dma unmap 0000:00:05.0 0x1f3a000 4096 to-device",
        "MARK 0.000000 Lost 2 events.",
        "MARK 3.001000 dma alloc 0000:00:05.0 0x100000 65536 bidirectional",
        "MARK 3.002000 dma unmap-sg 0000:00:05.0 0x2000 512 from-device",
    ]
    assert Renderer(irq=True).feed_batch(raws) == "MARK 0.000000 Lost 2 events.\n"
