"""The Python mirrors (mmiotrace_ng/format/records.py, mmiotrace_ng/format/abi.py) against the
C headers they mirror, compiled on the host.

The structs, fields, enums and #defines to check are read from the header text,
so a field, struct, enum member or #define added to a header and not to its
mirror makes these tests fail; sizes, offsets and values come from gcc.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from types import ModuleType

import pytest

from mmiotrace_ng.format import abi, records
from mmiotrace_ng.ksym import records as ksym_records

REPO = Path(__file__).resolve().parents[2]

RECORDS_H = REPO / "bpf" / "mmiotrace_ng.h"
ABI_H = REPO / "kmod" / "mmiotng_abi.h"
KSYM_H = REPO / "bpf" / "ksym.h"

# C type -> the ctypes type a mirror must use
C_TYPES: dict[str, type] = {
    "__u8": ctypes.c_uint8,
    "__s8": ctypes.c_int8,
    "__u16": ctypes.c_uint16,
    "__s16": ctypes.c_int16,
    "__u32": ctypes.c_uint32,
    "__s32": ctypes.c_int32,
    "__u64": ctypes.c_uint64,
    "__s64": ctypes.c_int64,
    "char": ctypes.c_char,
}


@dataclass(frozen=True)
class CField:
    ctype: str  # "__u64", "struct ng_rec_hdr", ...
    name: str
    count: str | None  # array length expression, None for a scalar


@dataclass
class Header:
    structs: dict[str, list[CField]]
    enums: dict[str, list[str]]
    defines: dict[str, str]  # name -> value text (non-empty values only)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", text)


ATTR_LIST = re.compile(r"^#define\s+MMIOTNG_ATTRS\(X\)((?:.*\\\n)*.*)$", re.MULTILINE)
ATTR_ENTRY = re.compile(r"\bX\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)")
NL_TYPES = {"U32": "uint32", "U64": "uint64", "STRING": "asciiz", "BINARY": "cdata"}


def attr_list(text: str) -> list[tuple[str, str, str]]:
    """(NAME, TYPE, DIR) of each X() of MMIOTNG_ATTRS, the attribute list."""
    m = ATTR_LIST.search(strip_comments(text))
    return ATTR_ENTRY.findall(m[1]) if m else []


def parse_header(text: str) -> Header:
    text = strip_comments(text)
    # the attribute list expands into enum mmiotng_attr
    names = "".join(f"MMIOTNG_A_{name}," for name, _t, _d in attr_list(text))
    text = re.sub(r"\bMMIOTNG_ATTRS\(\s*\w+\s*\)(?!\s*\\)", names, text)
    structs: dict[str, list[CField]] = {}
    for m in re.finditer(r"\bstruct\s+(\w+)\s*\{(.*?)\}\s*;", text, flags=re.DOTALL):
        fields = []
        for decl in m[2].split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            f = re.fullmatch(
                r"((?:struct\s+)?\w+)\s+(\w+)\s*(?:\[\s*([^\]]+?)\s*\])?", decl
            )
            assert f, f"cannot parse field {decl!r} of struct {m[1]}"
            fields.append(CField(f[1], f[2], f[3]))
        structs[m[1]] = fields
    enums: dict[str, list[str]] = {}
    for m in re.finditer(r"\benum\s+(\w+)\s*\{(.*?)\}\s*;", text, flags=re.DOTALL):
        members = [e.split("=")[0].strip() for e in m[2].split(",")]
        enums[m[1]] = [e for e in members if e]
    defines = {}
    for m in re.finditer(
        r"^[ \t]*#define[ \t]+(\w+)(?:[ \t]+(.*?))?[ \t]*$", text, flags=re.MULTILINE
    ):
        if m[2]:
            defines[m[1]] = m[2]
    return Header(structs, enums, defines)


def c_program(header_paths: list[Path], hdr: Header) -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/types.h>"]
    lines += [f'#include "{p}"' for p in header_paths]
    lines.append("int main(void) {")
    for sname, fields in hdr.structs.items():
        lines.append(f'printf("S {sname} %zu\\n", sizeof(struct {sname}));')
        for f in fields:
            lines.append(
                f'printf("F {sname} {f.name} %zu %zu\\n", offsetof(struct {sname}, {f.name}), '
                f"sizeof(((struct {sname} *)0)->{f.name}));"
            )
    for ename, members in hdr.enums.items():
        for member in members:
            lines.append(f'printf("E {ename} {member} %lld\\n", (long long){member});')
    for name, value in hdr.defines.items():
        if value.startswith('"'):
            lines.append(f'printf("DS {name} %s\\n", {name});')
        else:
            lines.append(f'printf("D {name} %lld\\n", (long long)({name}));')
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


def c_facts(header_paths: list[Path], hdr: Header, tmp: Path) -> list[tuple[str, str]]:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed to check the mirrors against the headers"
    src, exe = tmp / "layout.c", tmp / "layout"
    src.write_text(c_program(header_paths, hdr))
    subprocess.run([gcc, "-Wall", "-Werror", f"-I{ABI_H.parent}", "-o", str(exe), str(src)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [tuple(line.split(" ", 1)) for line in out.splitlines()]  # type: ignore[misc]


def expected_ctype(field: CField, mirror: ModuleType) -> type:
    if field.ctype.startswith("struct "):
        return mirror.C_STRUCTS[field.ctype.split()[1]]
    return C_TYPES[field.ctype]


def compare(header_paths: list[Path], mirror: ModuleType, tmp: Path) -> list[str]:
    """Every difference between the headers and the mirror module."""
    text = "".join(p.read_text() for p in header_paths)
    hdr = parse_header(text)
    problems: list[str] = []
    # every struct and enum of the header is mirrored, and nothing else
    for kind, c_names, py_map in (
        ("struct", hdr.structs, mirror.C_STRUCTS),
        ("enum", hdr.enums, mirror.C_ENUMS),
    ):
        for name in set(c_names) ^ set(py_map):
            where = "the mirror" if name in c_names else "the header"
            problems.append(f"{kind} {name} missing from {where}")
    # struct fields: names, order, types
    for sname, fields in hdr.structs.items():
        cls = mirror.C_STRUCTS.get(sname)
        if cls is None:
            continue
        py_fields = cls._fields_
        if [f.name for f in fields] != [f[0] for f in py_fields]:
            problems.append(
                f"struct {sname}: fields {[f.name for f in fields]} "
                f"!= mirror {[f[0] for f in py_fields]}"
            )
            continue
        for f, (name, ptype) in zip(fields, py_fields, strict=True):
            want = expected_ctype(f, mirror)
            if f.count is None:
                if ptype is not want:
                    problems.append(
                        f"struct {sname}.{name}: {f.ctype} mirrored as {ptype.__name__}"
                    )
            elif not (issubclass(ptype, ctypes.Array) and ptype._type_ is want):
                problems.append(
                    f"struct {sname}.{name}: {f.ctype}[{f.count}] mirrored as {ptype}"
                )
    # sizes, offsets, values from the compiler
    enum_values: dict[str, dict[str, int]] = {}
    for tag, rest in c_facts(header_paths, hdr, tmp):
        if tag == "S":
            sname, size = rest.split()
            cls = mirror.C_STRUCTS.get(sname)
            if cls is not None and ctypes.sizeof(cls) != int(size):
                problems.append(
                    f"sizeof(struct {sname}) {size} != mirror {ctypes.sizeof(cls)}"
                )
        elif tag == "F":
            sname, fname, offset, size = rest.split()
            cls = mirror.C_STRUCTS.get(sname)
            if cls is None or not hasattr(cls, fname):
                continue  # reported above
            desc = getattr(cls, fname)
            if (desc.offset, desc.size) != (int(offset), int(size)):
                problems.append(
                    f"struct {sname}.{fname}: offset/size {offset}/{size} "
                    f"!= mirror {desc.offset}/{desc.size}"
                )
        elif tag == "E":
            ename, member, value = rest.split()
            enum_values.setdefault(ename, {})[member] = int(value)
        else:
            name, value = rest.split(" ", 1)
            want: int | str = value if tag == "DS" else int(value)
            if not hasattr(mirror, name):
                problems.append(f"#define {name} missing from the mirror")
                continue
            actual = getattr(mirror, name)
            if actual != want or isinstance(actual, str) != (tag == "DS"):
                problems.append(f"#define {name} {want!r} != mirror {actual!r}")
    # no extra: every constant named like the header's is in the header
    known = set(hdr.defines) | {m for members in hdr.enums.values() for m in members}
    for name, value in vars(mirror).items():
        if (
            name.startswith(mirror.C_PREFIX)
            and isinstance(value, (int, str))
            and name not in known
        ):
            problems.append(f"{name} = {value!r} of the mirror is not in the header")
    for ename, values in enum_values.items():
        py_enum: type[IntEnum] | None = mirror.C_ENUMS.get(ename)
        if py_enum is None:
            continue
        # sentinels like __MMIOTNG_CMD_MAX are checked through the *_MAX #defines
        c_members = {k: v for k, v in values.items() if not k.startswith("__")}
        py_members = {m.name: int(m.value) for m in py_enum}
        if c_members != py_members:
            problems.append(f"enum {ename}: {c_members} != mirror {py_members}")
    # the payload type of each attribute, from the list
    if hasattr(mirror, "ATTR_TYPES"):
        want_types = {f"MMIOTNG_A_{name}": NL_TYPES.get(t, t) for name, t, _d in attr_list(text)}
        have = {m.name: t for m, t in mirror.ATTR_TYPES.items() if t != "none"}
        if have != want_types:
            problems.append(f"ATTR_TYPES {have} != the attribute list {want_types}")
    return problems


def test_records_mirror_matches_header(tmp_path: Path) -> None:
    assert compare([RECORDS_H], records, tmp_path) == []


def test_abi_mirror_matches_header(tmp_path: Path) -> None:
    assert compare([ABI_H], abi, tmp_path) == []


def test_ksym_mirror_matches_header(tmp_path: Path) -> None:
    assert compare([KSYM_H], ksym_records, tmp_path) == []
    assert set(parse_header(KSYM_H.read_text()).structs) == {
        "ng_ksym_watch", "ng_ksym_hit", "ng_ksym_key"}


def test_headers_parsed_completely() -> None:
    """The text parser sees what is there (else the comparisons prove nothing)."""
    rec = parse_header(RECORDS_H.read_text())
    assert set(rec.structs) == {
        "ng_rec_hdr",
        "ng_rec_access",
        "ng_rec_map",
        "ng_rec_unmap",
        "ng_rec_mark",
        "ng_rec_untraced",
        "ng_rec_irq",
        "ng_rec_dma",
        "ng_dev_name",
        "ng_phys_range",
        "ng_user_map_key",
        "ng_user_map_val",
        "ng_hist_key",
        "ng_hist_val",
    }
    assert [f.name for f in rec.structs["ng_rec_hdr"]] == [
        "ts_ns",
        "lost",
        "type",
        "cpu",
    ]
    assert len(rec.structs["ng_rec_access"]) == 15
    assert rec.enums["ng_rec_type"] == [
        "NG_REC_MAP",
        "NG_REC_UNMAP",
        "NG_REC_ACCESS",
        "NG_REC_MARK",
        "NG_REC_UNTRACED",
        "NG_REC_IRQ",
        "NG_REC_DMA",
    ]
    assert rec.enums["ng_config"][-1] == "NG_CONFIG_SLOTS"
    assert {"NG_MARK_MAX", "NG_INSN_BYTES"} <= set(rec.defines)
    kmod = parse_header(ABI_H.read_text())
    assert set(kmod.structs) == {"mmiotng_access", "mmiotng_map", "mmiotng_flight_hdr",
                                 "mmiotng_flight_map", "mmiotng_flight_rec"}
    assert set(kmod.enums) == {"mmiotng_cmd", "mmiotng_attr"}
    assert kmod.defines["MMIOTNG_GENL_NAME"] == '"mmiotrace_ng"'
    assert "MMIOTNG_A_MAX" in kmod.defines
    attrs = attr_list(ABI_H.read_text())
    assert len(attrs) == 30 and attrs[0] == ("PHYS", "U64", "REQ")
    assert attrs[-1] == ("USER_COMMS", "BINARY", "REQ")
    assert {d for _n, _t, d in attrs} == {"REQ", "REPLY"}
    assert kmod.enums["mmiotng_attr"][:2] == ["MMIOTNG_A_UNSPEC", "MMIOTNG_A_PHYS"]
    assert kmod.enums["mmiotng_attr"][-2:] == ["MMIOTNG_A_PAD", "__MMIOTNG_A_MAX"]


def _mutated(tmp_path: Path, src: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text
    out = tmp_path / src.name
    out.write_text(text.replace(old, new, 1))
    return out


@pytest.mark.parametrize(
    ("src", "mirror", "old", "new", "expect"),
    [
        # a new field
        (
            RECORDS_H,
            records,
            "\t__s32 map_id;\n\t__u32 pid;\n};",
            "\t__s32 map_id;\n\t__u32 pid;\n\t__u64 extra;\n};",
            "fields",
        ),
        # a changed type (same size, other signedness)
        (RECORDS_H, records, "__s32 map_id;", "__u32 map_id;", "mirrored as"),
        # a bigger array: different size/offset
        (
            RECORDS_H,
            records,
            "char text[NG_MARK_MAX];",
            "char text[NG_MARK_MAX + 8];",
            "sizeof",
        ),
        # a changed value
        (RECORDS_H, records, "NG_REC_MARK = 4", "NG_REC_MARK = 5", "enum ng_rec_type"),
        # a new #define
        (
            ABI_H,
            abi,
            "#define MMIOTNG_F_REP",
            "#define MMIOTNG_F_NEW\t0x04\n#define MMIOTNG_F_REP",
            "#define",
        ),
        # a new netlink attribute
        (
            ABI_H,
            abi,
            "\tX(STAT_ABI_VERSION, U32, REPLY)",
            "\tX(STAT_NEW, U64, REPLY) \\\n\tX(STAT_ABI_VERSION, U32, REPLY)",
            "enum mmiotng_attr",
        ),
        # an attribute of another payload type
        (ABI_H, abi, "X(MODE, U32, REQ)", "X(MODE, U64, REQ)", "ATTR_TYPES"),
        # a renamed #define: the old name is an extra in the mirror
        (
            ABI_H,
            abi,
            "#define MMIOTNG_F_REP",
            "#define MMIOTNG_F_REPEAT",
            "MMIOTNG_F_REP = 2 of the mirror is not in the header",
        ),
        # a new struct
        (
            ABI_H,
            abi,
            "/* Generic netlink */",
            "struct mmiotng_new { __u32 x; };",
            "struct mmiotng_new",
        ),
    ],
)
def test_compare_notices_header_changes(
    tmp_path: Path, src: Path, mirror: ModuleType, old: str, new: str, expect: str
) -> None:
    problems = compare([_mutated(tmp_path, src, old, new)], mirror, tmp_path)
    assert any(expect in p for p in problems), problems
