"""The running kernel's symbols, from /proc/kallsyms: where a symbol is,
and which function an address is in (`name+0xoff/0xsize [module]`, as the
kernel's %pS prints it: a symbol's size is the distance to the next)."""

from __future__ import annotations

import bisect
import gzip
import lzma
import re
import struct
import subprocess
from pathlib import Path
from typing import NamedTuple

KALLSYMS = Path("/proc/kallsyms")
TEXT_TYPES = frozenset("tTwW")
_LINE = r"^([0-9a-f]+) ({types}) ({name})(?:\t\[([^\]\s]+)\])?$"
_ADDR = re.compile(r"^([0-9a-f]+) ", re.MULTILINE)
_NONZERO = re.compile(r"^0*[1-9a-f][0-9a-f]* ", re.MULTILINE)


class Symbol(NamedTuple):
    addr: int
    type: str          # kallsyms' letter: t/T text, d/D data, b/B bss, r/R read-only ...
    name: str
    module: str        # "" for the kernel itself


class SymbolError(Exception):
    """The symbols cannot be read (or show no addresses)."""


class Kallsyms:
    """The text of /proc/kallsyms, searched as asked: a name by one regular
    expression over the text, the tables (every address, the functions in
    address order) built on first use.  Parsing all of it up front took
    most of a ksym start in a TCG guest (150,000 lines)."""

    def __init__(self, text: str | None = None) -> None:
        if text is None:
            try:
                text = KALLSYMS.read_text()
            except OSError as exc:
                raise SymbolError(f"cannot read {KALLSYMS}: {exc.strerror}") from exc
        if not _NONZERO.search(text):
            raise SymbolError(f"{KALLSYMS} shows no addresses (kernel.kptr_restrict, "
                              "or not root)")
        self.text = text
        self._addrs: list[int] | None = None
        self._text: list[Symbol] | None = None
        self._text_addrs: list[int] = []

    def _symbols(self, types: str, name: str) -> list[Symbol]:
        pattern = re.compile(_LINE.format(types=types, name=name), re.MULTILINE)
        out = [Symbol(int(a, 16), t, n, m) for a, t, n, m in pattern.findall(self.text)]
        out.sort(key=lambda s: s.addr)
        return out

    def named(self, name: str, module: str | None = None) -> list[Symbol]:
        """Symbols called name (in module, or "" for the kernel; any if None),
        in address order."""
        return [s for s in self._symbols(r"\S", re.escape(name))
                if module is None or s.module == module]

    def gap_after(self, sym: Symbol) -> int | None:
        """Bytes from sym to the next symbol at a higher address, None if
        it is the last."""
        if self._addrs is None:
            self._addrs = sorted({int(a, 16) for a in _ADDR.findall(self.text)})
        i = bisect.bisect_right(self._addrs, sym.addr)
        return self._addrs[i] - sym.addr if i < len(self._addrs) else None

    def function(self, addr: int) -> str:
        """`name+0xoff/0xsize [module]` of the function addr is in, or the
        address in hex if it is in none."""
        if self._text is None:
            self._text = self._symbols("[tTwW]", r"\S+")
            self._text_addrs = [s.addr for s in self._text]
        i = bisect.bisect_right(self._text_addrs, addr) - 1
        if i < 0:
            return f"0x{addr:x}"
        s = self._text[i]
        size = self.gap_after(s) or 0      # as %pS: to the next symbol of any kind
        if addr - s.addr >= size:
            return f"0x{addr:x}"
        return (f"{s.name}+0x{addr - s.addr:x}/0x{size:x}"
                + (f" [{s.module}]" if s.module else ""))


def _open_module(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".zst":
        raise SymbolError(f"{path}: zstd-compressed modules are not read (give /LEN)")
    return data


def elf_object_sizes(elf: bytes) -> dict[str, int]:
    """st_size of each data object of a 64-bit little-endian ELF file, by name."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise SymbolError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
                for i in range(shnum)]
    out: dict[str, int] = {}
    for _name, sh_type, _f, _a, off, size, link, _i, _al, entsize in sections:
        if sh_type != 2 or not entsize:       # SHT_SYMTAB
            continue
        stroff = sections[link][4]
        for k in range(size // entsize):
            st_name, st_info, _o, _shndx, _v, st_size = struct.unpack_from(
                "<IBBHQQ", elf, off + k * entsize)
            if st_info & 0xF != 1:             # STT_OBJECT
                continue
            end = elf.index(b"\0", stroff + st_name)
            out[elf[stroff + st_name:end].decode(errors="replace")] = st_size
    return out


def module_object_size(module: str, name: str) -> int | None:
    """The size of a data object of a loaded module, from its .ko file."""
    path = subprocess.run(["modinfo", "-n", module], capture_output=True,
                          text=True).stdout.strip()
    if not path or not Path(path).is_file():
        return None
    try:
        return elf_object_sizes(_open_module(Path(path))).get(name)
    except (OSError, SymbolError, struct.error, ValueError, lzma.LZMAError):
        return None
