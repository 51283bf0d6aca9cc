"""Register maps (mmiotrace_ng/analysis/regmap.py): the parser, its errors with their
line numbers, lookups (arrays included), field decoding, and the shipped
maps: e1000.regs against Linux's e1000_hw.h (from Debian's linux-source
tarball, which tests/setup.sh installs), edu.regs against QEMU's edu spec."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from mmiotrace_ng.analysis import regmap
from mmiotrace_ng.common.errors import UsageError

GOOD = """\
# a device with every kind of line
device 1234:abcd 1234:abce bar 2
device 5678:0001

0x00 4 CTRL      Control register (RW)
  0     EN
  3:1   MODE 0=OFF 1=SLOW 0x2=FAST  how fast
  31    RESET
0x04 2 SMALL
0x06 1 TINY      # comment after a register
0x08 8 WIDE      a 64-bit one
  63:32 HIGH
0x100+8*4 4 RAL%d  low halves
0x104+8*4 4 RAH%d  high halves, between the low ones
  31    AV
0x200+4*0x10 4 TABLE
0x10000+4*5000 4 BIG%d  larger than the expansion limit
"""


def parse(text: str) -> regmap.RegMap:
    return regmap.parse(text, "t.regs")


def test_a_good_map_parses_to_what_it_says():
    m = parse(GOOD)
    assert m.name == "t.regs"
    assert [(t.vendor, t.device, t.bar) for t in m.targets] == [
        (0x1234, 0xABCD, 2), (0x1234, 0xABCE, 2), (0x5678, 0x0001, 0)]
    assert m.bars_for(0x1234, 0xABCE) == [2] and m.bars_for(0x5678, 1) == [0]
    assert m.bars_for(0x1234, 0x0001) == []
    regs = {r.name: r for r in m.registers}
    assert list(regs) == ["CTRL", "SMALL", "TINY", "WIDE", "RAL%d", "RAH%d", "TABLE", "BIG%d"]
    ctrl = regs["CTRL"]
    assert (ctrl.offset, ctrl.width, ctrl.line) == (0, 4, 5)
    assert ctrl.description == "Control register (RW)"
    assert [(f.name, f.hi, f.lo, f.enums, f.description) for f in ctrl.fields] == [
        ("EN", 0, 0, {}, ""), ("MODE", 3, 1, {0: "OFF", 1: "SLOW", 2: "FAST"}, "how fast"),
        ("RESET", 31, 31, {}, "")]
    assert regs["TINY"].description == ""
    assert (regs["RAL%d"].offset, regs["RAL%d"].stride, regs["RAL%d"].count) == (0x100, 8, 4)
    assert (regs["TABLE"].stride, regs["TABLE"].count) == (4, 16)
    assert regs["BIG%d"].count == 5000 > regmap.EXPAND_LIMIT


@pytest.mark.parametrize("offset, name", [
    (0x00, "CTRL"), (0x02, "CTRL+2"), (0x04, "SMALL"), (0x05, "SMALL+1"), (0x06, "TINY"),
    (0x08, "WIDE"), (0x0F, "WIDE+7"),
    (0x100, "RAL0"), (0x104, "RAH0"), (0x108, "RAL1"), (0x11C, "RAH3"), (0x11E, "RAH3+2"),
    (0x200, "TABLE[0]"), (0x23C, "TABLE[15]"),
    (0x10000, "BIG0"), (0x10004 + 4 * 4998, "BIG4999"), (0x10001, "BIG0+1"),
])
def test_lookup_names_registers_and_array_elements(offset, name):
    hit = parse(GOOD).lookup(offset)
    assert hit is not None and hit.name == name


@pytest.mark.parametrize("offset", [0x07 + 0x9, 0x10, 0x0FC, 0x120, 0x240, 0xFFFF,
                                    0x10000 + 4 * 5000, 0x1_0000_0000])
def test_lookup_of_an_offset_no_register_holds(offset):
    assert parse(GOOD).lookup(offset) is None


def test_lookup_in_the_gap_of_a_strided_array():
    m = parse("device 1234:5678\n0x40+16*4 4 R%d\n")
    assert m.lookup(0x40 + 16 + 3).name == "R1+3"
    assert m.lookup(0x40 + 16 + 4) is None and m.lookup(0x40 + 16 * 3 + 8) is None


def test_decoding_fields_enums_and_uncovered_bits():
    m = parse(GOOD)
    # EN set, MODE=2 (FAST), RESET clear, bit 8 covered by no field
    assert m.describe(0, 4, 0b0101 | 0x100) == ("CTRL", "{EN=1 MODE=FAST ?=0x100}")
    # MODE 0 has a label, so it shows; EN and RESET at 0 do not
    assert m.describe(0, 4, 0) == ("CTRL", "{MODE=OFF}")
    # a value without a label: decimal below 10, hex from 10 on
    assert m.describe(8, 8, 7 << 32) == ("WIDE", "{HIGH=7}")
    assert m.describe(8, 8, 0xABC << 32) == ("WIDE", "{HIGH=0xabc}")
    assert m.describe(8, 8, 0) == ("WIDE", "{}")
    # no fields: no braces
    assert m.describe(4, 2, 0x1234) == ("SMALL", "")
    # array elements decode with the array's fields
    assert m.describe(0x11C, 4, 0x80000001) == ("RAH3", "{AV=1 ?=0x1}")


def test_decoding_a_narrow_access_shows_only_the_fields_it_covers():
    m = parse(GOOD)
    # a 1-byte read of CTRL+3 is bits 31..24: RESET, not EN or MODE
    assert m.describe(3, 1, 0x80) == ("CTRL+3", "{RESET=1}")
    assert m.describe(3, 1, 0x01) == ("CTRL+3", "{?=0x1000000}")
    # a 2-byte read of the low half: EN and MODE, not RESET
    assert m.describe(0, 2, 0x0003) == ("CTRL", "{EN=1 MODE=SLOW}")
    # a 4-byte read of WIDE's low half does not cover HIGH
    assert m.describe(8, 4, 0xFFFFFFFF) == ("WIDE", "{?=0xffffffff}")
    assert m.describe(12, 4, 0x5) == ("WIDE+4", "{HIGH=5}")


def test_overlapping_names_and_interleaved_arrays_are_fine():
    parse("device 1234:5678\n0x0+8*100 4 A%d\n0x4+8*100 4 B%d\n0x320 4 AFTER\n")


ERRORS = [
    # (text after a device line, line number, what the message says)
    ("10 4 X\n", 2, "offset '10': expected hex with 0x"),
    ("0x10+*4 4 X\n", 2, "offset '0x10+*4'"),
    ("0x10+4*0 4 X%d\n", 2, "array of 0 registers"),
    ("0x10 3 X\n", 2, "width '3'"),
    ("0x10 four X\n", 2, "width 'four'"),
    ("0x10+2*4 4 X%d\n", 2, "stride 2 is less than the width 4"),
    ("0x10 4 X-Y\n", 2, "register name 'X-Y'"),
    ("0x10 4 X%d\n", 2, "%d is for arrays only"),
    ("0x10 4\n", 2, "expected OFFSET WIDTH NAME"),
    ("0x10 4 X\n0x20 4 X\n", 3, "register X is defined twice (first on line 2)"),
    ("  0 EN\n", 2, "a field) before any register"),
    ("0x10 4 X\n  a:b EN\n", 3, "bits 'a:b'"),
    ("0x10 4 X\n  3:7 EN\n", 3, "the high bit comes first"),
    ("0x10 2 X\n  16 EN\n", 3, "bit 16 is outside X, a 16-bit register"),
    ("0x10 4 X\n  0 9EN\n", 3, "field name '9EN'"),
    ("0x10 4 X\n  0\n", 3, "expected BITS NAME"),
    ("0x10 4 X\n  1:0 M 4=BIG\n", 3, "value 4 does not fit the 2-bit field M"),
    ("0x10 4 X\n  1:0 M 1=A 0x1=B\n", 3, "value 0x1 of M is named twice"),
    ("0x10 4 X\n  0 EN\n  1 EN\n", 4, "field EN of X is defined twice (first on line 3)"),
    ("0x10 4 X\n  3:0 A\n\n  # a comment\n  4:3 B\n", 6, "field B overlaps field A (line 3)"),
    ("0x10 4 A\n0x12 2 B\n", 3, "B overlaps A (line 2) at offset 0x12"),
    ("0x12 2 B\n0x10 4 A\n", 3, "A overlaps B (line 2) at offset 0x12"),
    ("0x100+8*4 4 A%d\n0x118 4 B\n", 3, "B overlaps A%d (line 2) at offset 0x118"),
    ("0x100+8*4 4 A%d\n0x102+8*4 4 B%d\n", 3, "B%d overlaps A%d (line 2) at offset 0x102"),
    ("0x100+8*4 4 A%d\n0x11a+8*4 4 B%d\n", 3, "B%d overlaps A%d (line 2) at offset 0x11a"),
    ("0x100+8*4 4 A%d\n0x11c+8*4 4 B%d\n0x11c 1 C\n", 4, "C overlaps B%d (line 3) at offset 0x11c"),
    ("registers:\n", 2, "expected a register"),
    ("device 12345:1\n", 2, "device id '12345:1'"),
    ("device 1234:5679 bar 6\n", 2, "bar '6': a BAR is 0 to 5"),
    ("device 1234:5679 bar 1 1234:567a\n", 2, "'bar N' comes last"),
    ("device bar 1\n", 2, "at least one VVVV:DDDD id"),
    ("device 1234:5678\n", 2, "1234:5678 BAR0 is listed twice"),
]


@pytest.mark.parametrize("body, line, message", ERRORS)
def test_every_error_names_its_line(body, line, message):
    with pytest.raises(UsageError) as err:
        parse("device 1234:5678\n" + body)
    text = str(err.value)
    assert text.startswith(f"t.regs:{line}: "), text
    assert message in text, text


def test_a_map_must_say_what_it_is_for_and_have_registers():
    with pytest.raises(UsageError, match=r"^t\.regs: no 'device VVVV:DDDD bar N' line"):
        parse("0x0 4 CTRL\n")
    with pytest.raises(UsageError, match=r"^t\.regs: no registers"):
        parse("device 1234:5678\n# nothing else\n")


def test_find_takes_a_shipped_name_or_a_file(tmp_path):
    assert set(regmap.shipped()) >= {"e1000", "edu"}
    assert regmap.find("e1000").name == "e1000.regs"
    path = tmp_path / "mine.regs"
    path.write_text("device 1234:5678\n0x0 4 ONLY\n")
    assert regmap.find(str(path)).registers[0].name == "ONLY"
    with pytest.raises(UsageError, match=r"no register map 'nosuch' \(shipped: .*e1000.*edu"):
        regmap.find("nosuch")
    with pytest.raises(UsageError, match="cannot read register map"):
        regmap.find(str(tmp_path / "absent.regs"))
    bad = tmp_path / "bad.regs"
    bad.write_text("device 1234:5678\n0x0 4 A\n0x0 4 B\n")
    with pytest.raises(UsageError, match=rf"^{re.escape(str(bad))}:3: B overlaps A"):
        regmap.find(str(bad))


# --- the shipped maps ------------------------------------------------------------

# QEMU's docs/specs/edu.rst, "MMIO area spec": the offset of each register and,
# for the two with bits, which bit is what
EDU_SPEC = {0x00: "ID", 0x04: "LIVENESS", 0x08: "FACTORIAL", 0x20: "STATUS",
            0x24: "IRQ_STATUS", 0x60: "IRQ_RAISE", 0x64: "IRQ_ACK", 0x80: "DMA_SRC",
            0x88: "DMA_DST", 0x90: "DMA_COUNT", 0x98: "DMA_CMD"}


def test_edu_map_follows_qemus_spec():
    m = regmap.find("edu")
    assert [(t.vendor, t.device, t.bar) for t in m.targets] == [(0x1234, 0x11E8, 0)]
    assert {r.offset: r.name for r in m.registers} == EDU_SPEC
    assert all(r.width == (4 if r.offset < 0x80 else 8) for r in m.registers)
    # identification 0xRRrr00ed: version 1.0
    assert m.describe(0, 4, 0x010000ED) == ("ID", "{MAJOR=1 MAGIC=0xed}")
    # status: 0x01 computing, 0x80 raise an interrupt when done
    assert m.describe(0x20, 4, 0x81) == ("STATUS", "{COMPUTING=1 IRQ_FACT=1}")
    # DMA command: 0x01 start, 0x02 direction EDU to RAM, 0x04 interrupt when done
    assert m.describe(0x98, 8, 0x7) == ("DMA_CMD", "{START=1 DIR=EDU_TO_RAM IRQ=1}")
    assert m.describe(0x98, 8, 0x1) == ("DMA_CMD", "{START=1 DIR=RAM_TO_EDU}")


KERNEL_TARBALL = Path(os.environ.get("MMIOTNG_KERNEL_TARBALL",
                                     "/usr/src/linux-source-6.1.tar.xz"))
E1000_DIR = "drivers/net/ethernet/intel/e1000"


@pytest.fixture(scope="module")
def e1000_source(tmp_path_factory) -> Path:
    """drivers/net/ethernet/intel/e1000 of Linux 6.1: e1000_hw.h and e1000_main.c."""
    tree = os.environ.get("MMIOTNG_KSRC")
    if tree and (Path(tree) / E1000_DIR / "e1000_hw.h").exists():
        return Path(tree) / E1000_DIR
    if not KERNEL_TARBALL.exists():
        pytest.fail(f"{KERNEL_TARBALL} is missing: e1000.regs is checked against the kernel's "
                    "e1000_hw.h (apt-get install linux-source-6.1, as tests/setup.sh does)",
                    pytrace=False)
    out = tmp_path_factory.mktemp("e1000")
    top = "linux-source-6.1"
    subprocess.run(["tar", "-xf", str(KERNEL_TARBALL), "-C", str(out),
                    f"{top}/{E1000_DIR}/e1000_hw.h", f"{top}/{E1000_DIR}/e1000_main.c"],
                   check=True, capture_output=True, timeout=900)
    return out / top / E1000_DIR


def kernel_macros(header: str) -> dict[str, int]:
    """E1000_* macros of e1000_hw.h whose value is a number or another such
    macro (the header's aliases, E1000_IMS_LSC = E1000_ICR_LSC)."""
    raw = dict(re.findall(r"^#define\s+(E1000_\w+)\s+\(?\s*(0x[0-9A-Fa-f]+|\d+|E1000_\w+)"
                          r"\s*\)?\s*(?:/\*.*)?$", header, re.M))
    out: dict[str, int] = {}

    def value(name: str, depth: int = 0) -> int | None:
        v = raw.get(name)
        if v is None or depth > 5:
            return None
        return value(v, depth + 1) if v.startswith("E1000_") else int(v, 0)

    for name in raw:
        v = value(name)
        if v is not None:
            out[name] = v
    return out


# Fields whose names the header has no mask or value for (their bits are the
# SDM's), and one whose kernel name is no name here (it starts with a digit).
E1000_UNCHECKED_FIELDS = {("ITR", "INTERVAL"), ("RCTL", "MO"), ("RAH", "RAH"), ("RAH", "ASEL"),
                          ("MANC", "RMCP_0298_EN")}


def test_e1000_map_matches_the_kernel_header(e1000_source):
    macros = kernel_macros((e1000_source / "e1000_hw.h").read_text())
    m = regmap.find("e1000")
    wrong = []
    for r in m.registers:
        base = r.name.replace("%d", "")
        want = {"RAL": macros["E1000_RA"], "RAH": macros["E1000_RA"] + 4}.get(base)
        if want is None:
            want = macros.get(f"E1000_{base}")
        if want != r.offset:
            wrong.append(f"{r.name}: map 0x{r.offset:x}, header "
                         f"{'none' if want is None else hex(want)}")
    assert not wrong, wrong
    counts = {r.name: r.count for r in m.registers if r.count > 1}
    assert counts["MTA"] == macros["E1000_NUM_MTA_REGISTERS"] == 128
    assert counts["VFTA"] == macros["E1000_VLAN_FILTER_TBL_SIZE"] == 128
    assert counts["FFLT"] == macros["E1000_FFLT_SIZE"]
    assert counts["FFMT"] == macros["E1000_FFMT_SIZE"]
    assert counts["FFVT"] == macros["E1000_FFVT_SIZE"]
    # 16 receive addresses (the SDM's RAL/RAH 0..15; the driver uses 15 of them)
    assert counts["RAL%d"] == counts["RAH%d"] == macros["E1000_RAR_ENTRIES"] + 1


def test_e1000_fields_match_the_kernel_header(e1000_source):
    """Each field's mask is E1000_<REG>_<FIELD>[_MASK], or each of its named
    values is E1000_<REG>_<FIELD>_<LABEL>; the fields without either are the
    ones listed."""
    macros = kernel_macros((e1000_source / "e1000_hw.h").read_text())
    m = regmap.find("e1000")
    unchecked, wrong, checked = set(), [], 0
    for r in m.registers:
        reg = r.name.replace("%d", "")
        for f in r.fields:
            prefix = f"E1000_{reg}_{f.name}"
            mask = macros.get(prefix, macros.get(f"{prefix}_MASK"))
            values: dict[str, int] = {label: macros[f"{prefix}_{label}"]
                                      for label in f.enums.values()
                                      if f"{prefix}_{label}" in macros}
            if mask is None and not values:
                unchecked.add((reg, f.name))
                continue
            checked += 1
            if mask is not None and mask != f.mask:
                wrong.append(f"{reg}.{f.name}: map 0x{f.mask:x}, header 0x{mask:x}")
            for label, got in values.items():
                mine = [v << f.lo for v, name in f.enums.items() if name == label]
                if got not in mine:
                    wrong.append(f"{reg}.{f.name}={label}: map {[hex(v) for v in mine]}, "
                                 f"header 0x{got:x}")
    assert not wrong, wrong
    assert unchecked == E1000_UNCHECKED_FIELDS
    manc = {f.name: f.mask for f in m.lookup(0x5820).reg.fields}
    assert manc["RMCP_0298_EN"] == macros["E1000_MANC_0298_EN"]
    assert checked > 150
    # the registers with fields at least
    with_fields = {r.name for r in m.registers if r.fields}
    assert with_fields >= {"CTRL", "STATUS", "EECD", "EERD", "MDIC", "ICR", "ICS", "IMS",
                           "IMC", "RCTL", "TCTL"}


def test_e1000_map_is_for_the_e1000_drivers_devices(e1000_source):
    main = (e1000_source / "e1000_main.c").read_text()
    ids = {int(x, 16) for x in re.findall(r"INTEL_E1000_ETHERNET_DEVICE\((0x[0-9A-Fa-f]+)\)",
                                          main)}
    m = regmap.find("e1000")
    assert {(t.vendor, t.bar) for t in m.targets} == {(0x8086, 0)}
    # all but the 82542, whose receive registers and tables are elsewhere
    assert {t.device for t in m.targets} == ids - {0x1000}
    assert 0x100E in ids and len(ids) > 30


def test_e1000_status_decodes_as_qemus_reset_value():
    # QEMU's e1000 resets STATUS to 0x80000000 | GIO_MASTER_ENABLE | ASDV |
    # MTXCKOK | SPEED_1000 | FD | LU (hw/net/e1000.c, mac_reg_init)
    m = regmap.find("e1000")
    assert m.describe(8, 4, 0x80080783) == (
        "STATUS", "{FD=1 LU=1 SPEED=1000 ASDV=1000 MTXCKOK=1 GIO_MASTER_ENABLE=1 ?=0x80000000}")
    assert m.describe(0x5400 + 8 * 15, 4, 0x12345678) == ("RAL15", "")
    assert m.describe(0x5404, 4, 0x80005634) == ("RAH0", "{RAH=0x5634 AV=1}")
    assert m.describe(0x5200 + 4 * 127, 4, 0) == ("MTA[127]", "")
    assert m.lookup(0x5404 + 8 * 16) is None
