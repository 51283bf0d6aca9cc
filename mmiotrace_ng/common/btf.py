"""The sizes of the kernel's variables, and where members sit in its
structs, from its BTF (/sys/kernel/btf/vmlinux, and /sys/kernel/btf/MODULE
split on top of it).

BTF is a header, a type section and a string section.  A variable is a VAR
type (with pahole's global variable encoding all of them, else only the
per-CPU ones) whose type, through typedefs and qualifiers, has a size: an
integer, struct, union, enum or float says it, an array is its element's
times the count, a pointer 8 bytes (64-bit kernels).

Parsing the kernel's BTF (over 100,000 types) takes a third of a second, and
ten under TCG; each variable's size is therefore kept in a file of
/var/cache/mmiotrace-ng/btf named by a digest of the BTF's bytes (and its
base's, for a module's), and read from there on later starts."""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from pathlib import Path

from .cachedir import read_text, store_text

SYSFS = Path("/sys/kernel/btf")
CACHE_DIR = Path("/var/cache/mmiotrace-ng/btf")
CACHE_FORMAT = 1
MAGIC = 0xEB9F
POINTER_SIZE = 8

# kinds (include/uapi/linux/btf.h)
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
VOLATILE, CONST, RESTRICT, FUNC, FUNC_PROTO, VAR, DATASEC = 9, 10, 11, 12, 13, 14, 15
FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = 16, 17, 18, 19

SIZED = frozenset({INT, STRUCT, UNION, ENUM, ENUM64, FLOAT, DATASEC})
REFERENCES = frozenset({TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG, VAR})
# bytes after the 12-byte struct btf_type: fixed, and per vlen entry
_FIXED = {INT: 4, ARRAY: 12, VAR: 4, DECL_TAG: 4}
_PER_ENTRY = {STRUCT: 12, UNION: 12, ENUM: 8, FUNC_PROTO: 8, DATASEC: 12, ENUM64: 12}
_MAX_DEPTH = 64


class BTFError(Exception):
    """BTF that cannot be read; the message says why."""


class BTF:
    """One BTF blob: its types by id, its variables by name.  A module's
    BTF is split: its ids and string offsets go on from its base's."""

    def __init__(self, data: bytes, base: BTF | None = None) -> None:
        if len(data) < 24:
            raise BTFError(f"{len(data)} bytes: shorter than a BTF header")
        if struct.unpack_from("<H", data)[0] == MAGIC:
            self._end = "<"
        elif struct.unpack_from(">H", data)[0] == MAGIC:
            self._end = ">"
        else:
            raise BTFError("no BTF magic (0xeb9f)")
        hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(
            self._end + "5I", data, 4)
        types, strs = hdr_len + type_off, hdr_len + str_off
        if types + type_len > len(data) or strs + str_len > len(data):
            raise BTFError(f"sections past the end of its {len(data)} bytes")
        self.base = base
        self._data = data
        self._strs = strs
        self._str_len = str_len
        self._first_str = base._first_str + base._str_len if base else 0
        self.first_id = base.first_id + len(base._types) if base else 1
        # (kind, name offset, size or type, where its trailing data starts)
        self._types: list[tuple[int, int, int, int]] = []
        self._vars: dict[str, list[int]] = {}
        self._structs: dict[str, int] | None = None    # made on first use
        self._parse(types, types + type_len)

    def _parse(self, off: int, end: int) -> None:
        unpack = struct.Struct(self._end + "3I").unpack_from
        while off < end:
            if off + 12 > end:
                raise BTFError(f"a type cut short at byte {off}")
            name_off, info, size_type = unpack(self._data, off)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            if kind == 0 or kind > ENUM64:
                raise BTFError(f"type {self.first_id + len(self._types)}: unknown kind {kind}")
            if kind == VAR:
                self._vars.setdefault(self.name_at(name_off), []).append(
                    self.first_id + len(self._types))
            self._types.append((kind, name_off, size_type, off + 12))
            off += 12 + _FIXED.get(kind, 0) + _PER_ENTRY.get(kind, 0) * vlen
        if off != end:
            raise BTFError("the last type runs past the type section")

    def name_at(self, off: int) -> str:
        """The string at offset off of the (split) string section."""
        if off < self._first_str:
            assert self.base is not None
            return self.base.name_at(off)
        start = self._strs + off - self._first_str
        if off - self._first_str >= self._str_len:
            raise BTFError(f"string offset {off} past the string section")
        return self._data[start:self._data.index(b"\0", start)].decode(errors="replace")

    def _type(self, type_id: int) -> tuple[BTF, tuple[int, int, int, int]] | None:
        if type_id < self.first_id:
            return self.base._type(type_id) if self.base else None
        i = type_id - self.first_id
        return (self, self._types[i]) if i < len(self._types) else None

    def kind(self, type_id: int) -> int | None:
        found = self._type(type_id)
        return found[1][0] if found else None

    def name(self, type_id: int) -> str:
        found = self._type(type_id)
        return found[0].name_at(found[1][1]) if found else ""

    def ids(self, kind: int, name: str) -> list[int]:
        """Ids of the types of this kind called name, the base's first."""
        out = self.base.ids(kind, name) if self.base else []
        return out + [self.first_id + i for i, t in enumerate(self._types)
                      if t[0] == kind and self.name_at(t[1]) == name]

    def size(self, type_id: int) -> int | None:
        """Bytes of a type, None for void, a function or an incomplete type."""
        for _ in range(_MAX_DEPTH):
            found = self._type(type_id)
            if found is None:
                return None
            btf, (kind, _name, size_type, extra) = found
            if kind in SIZED:
                return size_type
            if kind == PTR:
                return POINTER_SIZE
            if kind == ARRAY:
                elem, _index, nelems = struct.unpack_from(btf._end + "3I", btf._data, extra)
                elem_size = self.size(elem)
                return None if elem_size is None else elem_size * nelems
            if kind not in REFERENCES:
                return None
            type_id = size_type
        return None

    def _resolved(self, type_id: int) -> int:
        """type_id through typedefs and qualifiers."""
        for _ in range(_MAX_DEPTH):
            found = self._type(type_id)
            if found is None or found[1][0] not in REFERENCES - {VAR}:
                return type_id
            type_id = found[1][2]
        return type_id

    def struct_id(self, name: str) -> int | None:
        """The id of the struct (or union) called name that has members,
        None if this BTF (or its base) has none."""
        if self._structs is None:
            self._structs = {}
            for i, (kind, name_off, _size, _extra) in enumerate(self._types):
                if kind in (STRUCT, UNION) and name_off:
                    self._structs.setdefault(self.name_at(name_off), self.first_id + i)
        found = self._structs.get(name)
        if found is None and self.base is not None:
            return self.base.struct_id(name)
        return found

    def _members(self, type_id: int) -> list[tuple[str, int, int]]:
        """(name, type id, offset in bits) of each member of a struct or
        union; [] for any other type."""
        found = self._type(self._resolved(type_id))
        if found is None or found[1][0] not in (STRUCT, UNION):
            return []
        btf, (_kind, _name, _size, extra) = found
        info = struct.unpack_from(btf._end + "I", btf._data, extra - 8)[0]
        out = []
        for k in range(info & 0xFFFF):
            name_off, mtype, offset = struct.unpack_from(btf._end + "3I", btf._data,
                                                         extra + 12 * k)
            if info >> 31:          # kind_flag: the offset's low 24 bits, then a bitfield size
                offset &= 0xFFFFFF
            out.append((btf.name_at(name_off), mtype, offset))
        return out

    def _member_bits(self, type_id: int, name: str, depth: int = 0) -> tuple[int, int] | None:
        """(offset in bits, type id) of the member called name, also inside
        the struct's anonymous structs and unions."""
        if depth > _MAX_DEPTH:
            return None
        for mname, mtype, offset in self._members(type_id):
            if mname == name:
                return offset, mtype
            if not mname:
                inner = self._member_bits(mtype, name, depth + 1)
                if inner is not None:
                    return offset + inner[0], inner[1]
        return None

    def member_offset(self, struct_name: str, path: str) -> int | None:
        """The byte offset of struct_name's member path ("a.b.c": members of
        members, through anonymous structs and unions), None if there is no
        such struct or member, or it does not start on a byte."""
        type_id = self.struct_id(struct_name)
        if type_id is None:
            return None
        bits = 0
        for name in path.split("."):
            found = self._member_bits(type_id, name)
            if found is None:
                return None
            bits += found[0]
            type_id = found[1]
        return bits // 8 if bits % 8 == 0 else None

    def datasec_sizes(self) -> dict[int, int]:
        """Each variable in a DATASEC (its id) and the size the section gives it."""
        out: dict[int, int] = {}
        for kind, _name, _size, extra in self._types:
            if kind != DATASEC:
                continue
            info = struct.unpack_from(self._end + "I", self._data, extra - 8)[0]
            for k in range(info & 0xFFFF):
                var, _offset, size = struct.unpack_from(self._end + "3I", self._data,
                                                        extra + 12 * k)
                out[var] = size
        return out

    def variable_size(self, name: str) -> int | None:
        """The size of the variable called name, None if this BTF has none
        (or several of different sizes)."""
        sizes = {self.size(v) for v in self._vars.get(name, [])}
        if len(sizes) != 1:
            return None
        return sizes.pop()

    def variable_sizes(self) -> dict[str, int]:
        """Each of this BTF's own variables that has one size, and its size."""
        out = {}
        for name in self._vars:
            size = self.variable_size(name)
            if size is not None:
                out[name] = size
        return out


@functools.lru_cache(maxsize=8)
def _read(module: str) -> bytes | None:
    """The bytes of the kernel's BTF (module "") or a loaded module's,
    None if there are none; BTFError if they cannot be read."""
    path = SYSFS / (module or "vmlinux")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BTFError(f"cannot read {path}: {exc.strerror}") from exc


@functools.lru_cache(maxsize=8)
def load(module: str = "") -> BTF | None:
    """The running kernel's BTF (module "") or a loaded module's, None if
    the kernel has none for it; BTFError if it cannot be read."""
    base = load() if module else None
    if module and base is None:
        return None
    data = _read(module)
    if data is None:
        return None
    try:
        return BTF(data, base)
    except (BTFError, struct.error, ValueError) as exc:
        raise BTFError(f"{SYSFS / (module or 'vmlinux')}: {exc}") from exc


def clear_caches() -> None:
    """Forget what this process read (the files stay)."""
    for fn in (_read, load, variable_sizes):
        fn.cache_clear()


def present(module: str = "") -> bool:
    """Whether the kernel has BTF for itself (module "") or for a module."""
    return (SYSFS / "vmlinux").exists() and (not module or (SYSFS / module).exists())


def _cache_key(module: str) -> str | None:
    """A digest of the BTF a module's (or the kernel's) sizes come from:
    its bytes, and its base's for a module."""
    data = _read(module)
    base = _read("") if module else b""
    if data is None or base is None:
        return None
    h = hashlib.blake2b(digest_size=16)
    for part in (str(CACHE_FORMAT).encode(), base, data):
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def _cached_sizes(key: str, cache_dir: Path) -> dict[str, int] | None:
    text = read_text(cache_dir, f"{key}.json")
    if text is None:
        return None
    try:
        sizes = json.loads(text)
    except ValueError:
        return None
    if not isinstance(sizes, dict) or not all(
            isinstance(k, str) and type(v) is int and v > 0 for k, v in sizes.items()):
        return None
    return sizes


@functools.lru_cache(maxsize=8)
def variable_sizes(module: str = "") -> dict[str, int] | None:
    """Each variable of the kernel (module "") or of a loaded module that
    has one size, and its size: from the cache when it has this BTF, else
    parsed (and kept there).  None where there is no BTF."""
    cache_dir = CACHE_DIR
    key = _cache_key(module)
    if key is None:
        return None
    sizes = _cached_sizes(key, cache_dir)
    if sizes is None:
        btf = load(module)
        if btf is None:
            return None
        sizes = btf.variable_sizes()
        store_text(cache_dir, f"{key}.json", json.dumps(sizes, separators=(",", ":")))
    return sizes


def variable_size(name: str, module: str = "") -> int | None:
    """The size of a variable of the kernel (module "") or of a loaded
    module, from the BTF in /sys/kernel/btf; None where it has none."""
    sizes = variable_sizes(module)
    return sizes.get(name) if sizes is not None else None
