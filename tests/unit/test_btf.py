"""The BTF reader: variable sizes from a BTF blob built here by hand (the
layout of include/uapi/linux/btf.h), split module BTF on top of it, and the
running kernel's own BTF where this host has one."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from unittest import mock

import pytest
from ng_require import missing

from mmiotrace_ng.common import btf
from mmiotrace_ng.common.btf import BTF, BTFError

(INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC,
 FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64) = range(1, 20)


class Blob:
    """A BTF blob written type by type; a split one goes on from its base's
    last type id and string offset."""

    def __init__(self, end: str = "<", base: Blob | None = None) -> None:
        self.end = end
        self.types = bytearray()
        self.strs = bytearray() if base else bytearray(b"\0")
        self.first_str = len(base.strs) + base.first_str if base else 0
        self.next_id = base.next_id if base else 1
        self.secinfo: list[tuple[int, int, int]] = []

    def _str(self, name: str) -> int:
        if not name:
            return 0
        off = self.first_str + len(self.strs)
        self.strs += name.encode() + b"\0"
        return off

    def add(self, kind: int, name: str, size_type: int, vlen: int = 0,
            extra: bytes = b"") -> int:
        self.types += struct.pack(self.end + "III", self._str(name),
                                  (kind << 24) | vlen, size_type) + extra
        self.next_id += 1
        return self.next_id - 1

    def u32s(self, *values: int) -> bytes:
        return struct.pack(self.end + f"{len(values)}I", *values)

    def var(self, name: str, type_id: int, size: int) -> int:
        """A global variable, listed in .data with the size the ELF symbol has."""
        var = self.add(VAR, name, type_id, extra=self.u32s(1))
        self.secinfo.append((var, 8 * len(self.secinfo), size))
        return var

    def datasec(self) -> int:
        return self.add(DATASEC, ".data", 8 * len(self.secinfo), len(self.secinfo),
                        b"".join(self.u32s(*s) for s in self.secinfo))

    def bytes(self) -> bytes:
        hdr = struct.pack(self.end + "HBB5I", 0xEB9F, 1, 0, 24, 0, len(self.types),
                          len(self.types), len(self.strs))
        return hdr + bytes(self.types) + bytes(self.strs)


# each variable and the size C gives it on x86-64
BASE_SIZES = {"v_int": 4, "v_buf": 37, "v_grid": 111, "v_pair": 24, "v_u": 16, "v_e": 4,
              "v_e64": 8, "v_ptr": 8, "v_double": 8, "v_same": 4}


def base_blob(end: str = "<") -> Blob:
    b = Blob(end)
    i = b.add(INT, "int", 4, extra=b.u32s((1 << 24) | 32))      # signed, 32 bits
    c = b.add(INT, "char", 1, extra=b.u32s((1 << 24) | 8))
    ul = b.add(INT, "long unsigned int", 8, extra=b.u32s(64))
    u32 = b.add(TYPEDEF, "u32", i)
    cv = b.add(VOLATILE, "", b.add(CONST, "", u32))               # const volatile u32
    buf = b.add(ARRAY, "", 0, extra=b.u32s(c, i, 37))             # char [37]
    grid = b.add(ARRAY, "", 0, extra=b.u32s(buf, i, 3))           # char [3][37]
    pair = b.add(STRUCT, "pair", 24, 2, b.u32s(b._str("a"), ul, 0, b._str("b"), buf, 64))
    u = b.add(UNION, "u", 16, 2, b.u32s(b._str("x"), ul, 0, b._str("y"), pair, 0))
    e = b.add(ENUM, "e", 4, 3, b.u32s(b._str("E0"), 0, b._str("E1"), 1, b._str("E2"), 2))
    e64 = b.add(ENUM64, "e64", 8, 2, b.u32s(b._str("BIG"), 0, 1, b._str("SMALL"), 1, 0))
    fwd = b.add(FWD, "opaque", 0)
    proto = b.add(FUNC_PROTO, "", i, 2, b.u32s(b._str("p"), pair, b._str("q"), ul))
    b.add(FUNC, "f", proto, vlen=1)                               # global linkage
    dbl = b.add(FLOAT, "double", 8)
    b.add(DECL_TAG, "tag", pair, extra=struct.pack(b.end + "i", -1))
    tagged = b.add(TYPE_TAG, "rcu", pair)
    ptr = b.add(RESTRICT, "", b.add(PTR, "", tagged))             # struct pair __rcu *restrict
    for name, t in [("v_int", cv), ("v_buf", buf), ("v_grid", grid), ("v_pair", pair),
                    ("v_u", u), ("v_e", e), ("v_e64", e64), ("v_ptr", ptr),
                    ("v_double", dbl), ("v_same", i), ("v_same", u32)]:
        b.var(name, t, BASE_SIZES[name])
    b.var("v_opaque", fwd, 0)
    b.var("v_twice", i, 4)        # two variables of one name, of different sizes
    b.var("v_twice", ul, 8)
    b.datasec()
    return b


@pytest.mark.parametrize("end", ["<", ">"])
def test_variable_sizes_through_every_kind(end):
    t = BTF(base_blob(end).bytes())
    assert {n: t.variable_size(n) for n in BASE_SIZES} == BASE_SIZES
    assert t.variable_size("v_opaque") is None       # a declared struct has no size
    assert t.variable_size("v_twice") is None        # which one?
    assert t.variable_size("no_such") is None
    assert t.variable_size("f") is None              # a function


def test_types_by_kind_and_name_and_the_datasec():
    b = base_blob()
    t = BTF(b.bytes())
    (pair,) = t.ids(STRUCT, "pair")
    assert (t.size(pair), t.name(pair), t.kind(pair)) == (24, "pair", STRUCT)
    assert t.ids(STRUCT, "u") == [] and len(t.ids(UNION, "u")) == 1
    assert t.size(0) is None                         # void
    assert t.datasec_sizes() == {v: size for v, _off, size in b.secinfo}


def layout_blob(end: str = "<") -> tuple[Blob, int]:
    """struct outer { long a; struct inner in; union { int u1; struct {
    char pad[3]; char deep; }; }; unsigned int bits: 3, more: 5; }, its
    members at bytes 0, 8, 24 (deep 27) and bits 224/227 (kind_flag)."""
    b = Blob(end)
    ul = b.add(INT, "long unsigned int", 8, extra=b.u32s(64))
    i = b.add(INT, "int", 4, extra=b.u32s((1 << 24) | 32))
    c = b.add(INT, "char", 1, extra=b.u32s((1 << 24) | 8))
    ui = b.add(INT, "unsigned int", 4, extra=b.u32s(32))
    pad = b.add(ARRAY, "", 0, extra=b.u32s(c, i, 3))
    inner = b.add(STRUCT, "inner", 16, 2, b.u32s(b._str("x"), ul, 0, b._str("name"), ul, 64))
    inner_t = b.add(CONST, "", b.add(TYPEDEF, "inner_t", inner))
    anon_s = b.add(STRUCT, "", 4, 2, b.u32s(b._str("pad"), pad, 0, b._str("deep"), c, 24))
    anon_u = b.add(UNION, "", 4, 2, b.u32s(b._str("u1"), i, 0, 0, anon_s, 0))
    b.add(FWD, "outer", 0)                       # a declaration first: not the struct
    outer = b.add(STRUCT, "outer", 32, 5,
                  b.u32s(b._str("a"), ul, 0, b._str("in"), inner_t, 64, 0, anon_u, 192,
                         b._str("bits"), ui, (3 << 24) | 224, b._str("more"), ui,
                         (5 << 24) | 227))
    # kind_flag: the members' offsets carry a bitfield size in their top byte
    b.types[-12 * 5 - 12 + 4:-12 * 5 - 12 + 8] = b.u32s((STRUCT << 24) | (1 << 31) | 5)
    return b, outer


@pytest.mark.parametrize("end", ["<", ">"])
def test_member_offsets_through_members_typedefs_and_anonymous_unions(end):
    b, outer = layout_blob(end)
    t = BTF(b.bytes())
    assert t.struct_id("outer") == outer
    assert t.struct_id("nope") is None
    got = {path: t.member_offset("outer", path)
           for path in ("a", "in", "in.name", "u1", "deep", "pad", "bits", "more",
                        "in.nope", "nope", "a.x")}
    assert got == {"a": 0, "in": 8, "in.name": 16, "u1": 24, "deep": 27, "pad": 24,
                   "bits": 28, "more": None, "in.nope": None, "nope": None, "a.x": None}
    assert t.member_offset("nope", "a") is None
    assert t.member_offset("inner", "name") == 8


def test_member_offsets_of_a_split_blob_find_the_bases_structs():
    b, _outer = layout_blob()
    m = Blob(base=b)
    m.add(STRUCT, "mod", 8, 1, m.u32s(m._str("o"), 1, 0))
    t = BTF(m.bytes(), BTF(b.bytes()))
    assert t.member_offset("outer", "in.name") == 16
    assert t.member_offset("mod", "o") == 0


def module_blob(base: Blob) -> Blob:
    m = Blob(base=base)
    st = m.add(STRUCT, "mod_state", 48, 1, m.u32s(m._str("regs"), 3, 0))
    m.var("mod_counter", 3, 8)                               # the base's unsigned long
    m.var("mod_state_v", st, 48)
    m.var("mod_table", m.add(ARRAY, "", 0, extra=m.u32s(1, 1, 10)), 40)   # int [10]
    m.datasec()
    return m


def test_split_module_btf_goes_on_from_the_base():
    b = base_blob()
    base = BTF(b.bytes())
    mod = BTF(module_blob(b).bytes(), base)
    assert mod.first_id == b.next_id
    assert (mod.variable_size("mod_counter"), mod.variable_size("mod_state_v"),
            mod.variable_size("mod_table")) == (8, 48, 40)
    (st,) = mod.ids(STRUCT, "mod_state")
    assert st >= b.next_id and mod.name(st) == "mod_state"
    assert mod.variable_size("v_pair") is None       # the kernel's, not the module's
    assert mod.ids(STRUCT, "pair") == base.ids(STRUCT, "pair")


@pytest.mark.parametrize(("blob", "why"), [
    (b"\x9f\xeb\x01\x00", "shorter than a BTF header"),
    (b"\x00\x00" + bytes(40), "no BTF magic"),
    (base_blob().bytes()[:-40], "past the end"),
])
def test_unreadable_blobs(blob, why):
    with pytest.raises(BTFError, match=why):
        BTF(blob)


def test_an_unknown_kind_is_an_error_not_a_guess():
    b = Blob()
    b.add(INT, "int", 4, extra=b.u32s(32))
    b.add(25, "future", 0)
    with pytest.raises(BTFError, match="unknown kind 25"):
        BTF(b.bytes())


def test_a_type_running_past_its_section():
    b = Blob()
    b.add(STRUCT, "s", 8, 2, b.u32s(0, 0, 0))        # says 2 members, has 1
    with pytest.raises(BTFError, match="past the type section|cut short"):
        BTF(b.bytes())


@pytest.fixture
def sysfs(tmp_path, monkeypatch) -> Path:
    """A /sys/kernel/btf of the test's blobs, and a cache directory of its own."""
    b = base_blob()
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "vmlinux").write_bytes(b.bytes())
    (tmp_path / "sys" / "edu_exerciser").write_bytes(module_blob(b).bytes())
    (tmp_path / "sys" / "broken").write_bytes(bytes(32))        # no magic
    monkeypatch.setattr(btf, "SYSFS", tmp_path / "sys")
    monkeypatch.setattr(btf, "CACHE_DIR", tmp_path / "cache")
    btf.clear_caches()
    yield tmp_path
    btf.clear_caches()


def test_load_from_sysfs(sysfs):
    assert btf.variable_size("v_grid") == 111
    assert btf.variable_size("mod_state_v", "edu_exerciser") == 48
    assert btf.variable_size("mod_state_v") is None
    assert btf.variable_size("x", "not_loaded") is None
    assert btf.present("edu_exerciser") and not btf.present("not_loaded")
    with pytest.raises(BTFError, match="broken"):
        btf.variable_size("x", "broken")


def test_sizes_come_from_the_cache_of_the_same_btf_only(sysfs):
    """A later start reads the sizes from the cache, without parsing; a BTF
    that changed (a module built again) is parsed again; a cache file that is
    not what this tool writes, or a directory others may write, is ignored."""
    assert btf.variable_size("mod_state_v", "edu_exerciser") == 48
    cache = sysfs / "cache"
    assert cache.stat().st_mode & 0o777 == 0o700
    files = sorted(cache.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["mod_state_v"] == 48
    # what a later start finds in the cache is what it uses, unparsed
    files[0].write_text(json.dumps({"mod_state_v": 12}))
    btf.clear_caches()
    with mock.patch.object(btf, "BTF", side_effect=AssertionError("parsed")):
        assert btf.variable_size("mod_state_v", "edu_exerciser") == 12
    # the module is built again with a larger struct: another key, parsed again
    b = base_blob()
    m = Blob(base=b)
    m.var("mod_state_v", m.add(STRUCT, "mod_state", 64, 1, m.u32s(m._str("regs"), 3, 0)), 64)
    m.datasec()
    (sysfs / "sys" / "edu_exerciser").write_bytes(m.bytes())
    btf.clear_caches()
    assert btf.variable_size("mod_state_v", "edu_exerciser") == 64
    assert len(list(cache.glob("*.json"))) == 2
    (sysfs / "sys" / "edu_exerciser").write_bytes(module_blob(b).bytes())
    # a file that is not a map of names to sizes: parsed again
    files[0].write_text(json.dumps({"mod_state_v": "48"}))
    btf.clear_caches()
    assert btf.variable_size("mod_state_v", "edu_exerciser") == 48
    # a directory others may write: not read
    files[0].write_text(json.dumps({"mod_state_v": 12}))
    cache.chmod(0o777)
    btf.clear_caches()
    assert btf.variable_size("mod_state_v", "edu_exerciser") == 48


VMLINUX = Path("/sys/kernel/btf/vmlinux")


def test_the_running_kernels_btf():
    """Every variable's size through its type is the size its section gives
    it (pahole writes that from the ELF symbol), and known variables have
    theirs: per-CPU ones in any BTF, the rest with pahole's global variables."""
    if not VMLINUX.exists():
        missing(f"{VMLINUX} (a kernel with CONFIG_DEBUG_INFO_BTF)")
    t = BTF(VMLINUX.read_bytes())
    sections = t.datasec_sizes()
    assert sections, "no variables in the kernel's BTF"
    wrong = {t.name(v): (t.size(v), size) for v, size in sections.items()
             if t.size(v) != size}
    assert not wrong

    def struct_size(name: str) -> int | None:
        sizes = {t.size(i) for i in t.ids(STRUCT, name)}
        return sizes.pop() if len(sizes) == 1 else None

    known = {"jiffies_64": 8, "cpu_number": 4, "this_cpu_off": 8,
             "init_task": struct_size("task_struct"), "runqueues": struct_size("rq")}
    found = {n: t.variable_size(n) for n in known if t.variable_size(n) is not None}
    assert found, "none of the known variables in the kernel's BTF"
    assert found == {n: known[n] for n in found}
