"""ksym requests: `[MODULE:]SYMBOL[+OFF][/LEN]:OP`, parsed and resolved
against the running kernel's symbols before anything is armed.

OP is `rw-` (reads and writes) or `-w-` (writes): x86 has no read-only data
breakpoint.  LEN is 1, 2, 4 or 8 bytes, aligned to itself (the debug
registers' rule); by default the symbol's size when that is one of those,
else 8.  The size is the variable's in the kernel's BTF (/sys/kernel/btf)
where that has it, else for a module the object's in its .ko file (.ko.xz,
.ko.zst and .ko.gz too); for a kernel variable BTF does not have (the
kernel ships no symbol sizes) the distance to the next symbol stands in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..common import btf
from ..common.btf import variable_size as btf_variable_size
from ..common.symbols import TEXT_TYPES, Kallsyms, Symbol, SymbolError, module_object_size
from .records import NG_KSYM_MAX_WATCHES

LENGTHS = (8, 4, 2, 1)
OPS = {"rw-": "RW", "-w-": "W"}
SYMBOL = re.compile(r"([A-Za-z_.$][\w.$]*)(?:\+(0x[0-9a-fA-F]+|[0-9]+))?(?:/([0-9]+))?")


class RequestError(Exception):
    """A request that cannot be watched; the message says why in one line."""


@dataclass(frozen=True)
class Watch:
    text: str          # as asked, without the OP: the Symbol column
    module: str        # "" for the kernel
    symbol: str
    offset: int
    addr: int
    len: int
    type: str          # "RW" or "W"
    note: str = ""     # how LEN was chosen, when it was not given or known


@dataclass(frozen=True)
class Spec:
    text: str
    module: str
    symbol: str
    offset: int
    len: int | None
    type: str


def parse(req: str) -> Spec:
    """The parts of one request; RequestError if it is malformed."""
    parts = req.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise RequestError(f"{req!r}: expected [MODULE:]SYMBOL[+OFF][/LEN]:OP "
                           "(one ':' before OP, one after MODULE)")
    op = parts[-1]
    if op == "r--":
        raise RequestError(f"{req!r}: x86 has no read-only data breakpoint: "
                           "watch reads and writes with rw-")
    if op not in OPS:
        raise RequestError(f"{req!r}: OP must be rw- (reads and writes) or -w- (writes), "
                           f"not {op!r}")
    module = parts[0] if len(parts) == 3 else ""
    if module and not re.fullmatch(r"[\w-]+", module):
        raise RequestError(f"{req!r}: {module!r} is not a module name")
    m = SYMBOL.fullmatch(parts[-2])
    if not m:
        raise RequestError(f"{req!r}: {parts[-2]!r} is not SYMBOL[+OFF][/LEN]")
    length = int(m[3]) if m[3] else None
    if length is not None and length not in LENGTHS:
        raise RequestError(f"{req!r}: LEN must be 1, 2, 4 or 8 bytes, not {length}")
    return Spec(":".join(parts[:-1]), module.replace("-", "_"), m[1], int(m[2] or "0", 0),
                length, OPS[op])


def _the_symbol(spec: Spec, syms: Kallsyms) -> Symbol:
    where = f"module {spec.module}" if spec.module else "the kernel"
    found = syms.named(spec.symbol, spec.module)
    if not found:
        elsewhere = sorted({s.module for s in syms.named(spec.symbol)} - {""})
        hint = f" (it is in {', '.join(elsewhere)}: MODULE:SYMBOL)" if elsewhere else ""
        raise RequestError(f"{spec.text}: no symbol {spec.symbol} in {where}{hint}")
    if len({s.addr for s in found}) > 1:
        raise RequestError(f"{spec.text}: {len(found)} symbols named {spec.symbol} in "
                           f"{where}; cannot tell which")
    sym = found[0]
    if sym.type in TEXT_TYPES:
        raise RequestError(f"{spec.text}: {spec.symbol} is a function; ksym watches data")
    return sym


def _size(sym: Symbol) -> tuple[int | None, str]:
    """The size of a variable, or None and why there is none."""
    try:
        size = btf_variable_size(sym.name, sym.module)
        btf_why = "none in its BTF" if btf.present(sym.module) else "no BTF"
    except btf.BTFError as exc:
        size, btf_why = None, str(exc)
    if size is not None:
        return size, ""
    if not sym.module:
        return None, f"the kernel gives no size for {sym.name} ({btf_why})"
    try:
        size = module_object_size(sym.module, sym.name)
    except SymbolError as exc:
        return None, f"no size for {sym.name} ({btf_why}): {exc}"
    if size is not None:
        return size, ""
    return None, (f"no size for {sym.name} ({btf_why}), and no .ko file of {sym.module} "
                  "(nor .ko.xz, .ko.zst, .ko.gz) found to read it from")


def _length(spec: Spec, sym: Symbol, syms: Kallsyms) -> tuple[int, str]:
    addr = sym.addr + spec.offset
    if spec.len is not None:
        return spec.len, ""
    size, why = _size(sym)
    if size is not None:
        size -= spec.offset
        if size in LENGTHS and addr % size == 0:
            return size, ""
        # an array, a string, a struct: 8 bytes, or as many as its
        # alignment lets one debug register watch
        n = next(n for n in LENGTHS if addr % n == 0)
        return n, ("" if n == 8 else f"{spec.text}: {size} bytes at 0x{addr:x}; watching the "
                   f"first {n} (a debug register needs its length's alignment); /LEN chooses")
    gap = syms.gap_after(sym)
    room = (gap - spec.offset) if gap is not None else 8
    for n in LENGTHS:
        if n <= room and addr % n == 0:
            return n, (f"{spec.text}: {why}; watching {n} bytes (the next symbol is {gap} "
                       "bytes on); /LEN chooses")
    return 1, ""


def resolve(requests: list[str], syms: Kallsyms) -> list[Watch]:
    """Every request as a watch, or RequestError for the first bad one."""
    if len(requests) > NG_KSYM_MAX_WATCHES:
        raise RequestError(f"{len(requests)} watches asked; at most {NG_KSYM_MAX_WATCHES} "
                           "at a time (the x86 debug registers)")
    watches: list[Watch] = []
    for req in requests:
        spec = parse(req)
        sym = _the_symbol(spec, syms)
        length, note = _length(spec, sym, syms)
        addr = sym.addr + spec.offset
        if addr % length:
            raise RequestError(f"{spec.text}: a {length}-byte watch must be {length}-byte "
                               f"aligned (0x{addr:x} is not)")
        for w in watches:
            if w.addr == addr:
                raise RequestError(f"{spec.text}: watched twice (as {w.text} too)")
        watches.append(Watch(spec.text, sym.module, sym.name, spec.offset, addr, length,
                             spec.type, note))
    return watches
