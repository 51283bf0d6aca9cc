"""The running kernel's symbols, from /proc/kallsyms: where a symbol is,
and which function an address is in (`name+0xoff/0xsize [module]`, as the
kernel's %pS prints it: a symbol's size is the distance to the next); and
the sizes of a module's data objects, from its file (.ko, or compressed as
distributions ship it)."""

from __future__ import annotations

import bisect
import functools
import gzip
import lzma
import os
import re
import shutil
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

    def locate(self, addr: int) -> tuple[Symbol, int] | None:
        """The function addr is in and the function's size, None if it is in
        none."""
        if self._text is None:
            self._text = self._symbols("[tTwW]", r"\S+")
            self._text_addrs = [s.addr for s in self._text]
        i = bisect.bisect_right(self._text_addrs, addr) - 1
        if i < 0:
            return None
        s = self._text[i]
        size = self.gap_after(s) or 0      # as %pS: to the next symbol of any kind
        if addr - s.addr >= size:
            return None
        return s, size

    def function(self, addr: int) -> str:
        """`name+0xoff/0xsize [module]` of the function addr is in, or the
        address in hex if it is in none."""
        found = self.locate(addr)
        if found is None:
            return f"0x{addr:x}"
        s, size = found
        return (f"{s.name}+0x{addr - s.addr:x}/0x{size:x}"
                + (f" [{s.module}]" if s.module else ""))


MODULES_DIR = Path("/lib/modules")
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
_NO_ZSTD = ("neither Python's compression.zstd (3.14 on), the zstandard module nor the "
            "zstd command (apt-get install zstd) is here to decompress it")


def _unzstd(data: bytes, path: Path) -> bytes:
    try:
        from compression import zstd  # Python 3.14
    except ImportError:
        pass
    else:
        return zstd.decompress(data)
    try:
        import zstandard
    except ImportError:
        pass
    else:
        stream = zstandard.ZstdDecompressor().decompressobj()
        out = stream.decompress(data)
        if not stream.eof:             # a cut file decompresses in part, silently
            raise SymbolError(f"cannot decompress {path}: the zstd stream ends early")
        return out
    exe = shutil.which("zstd")
    if exe is None:
        raise SymbolError(f"{path} is zstd-compressed, and {_NO_ZSTD}")
    run = subprocess.run([exe, "-dcq"], input=data, capture_output=True)
    if run.returncode:
        err = run.stderr.decode(errors="replace").strip().splitlines()
        raise SymbolError(f"{path}: zstd -d failed: {err[-1] if err else run.returncode}")
    return run.stdout


def read_module(path: Path) -> bytes:
    """The ELF image of a module file: .ko, or .ko.xz, .ko.zst, .ko.gz
    decompressed.  SymbolError if it cannot be read."""
    try:
        data = path.read_bytes()
        if path.suffix == ".xz":
            return lzma.decompress(data)
        if path.suffix == ".gz":
            return gzip.decompress(data)
    except OSError as exc:          # gzip's BadGzipFile is one
        raise SymbolError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (lzma.LZMAError, EOFError) as exc:
        raise SymbolError(f"cannot decompress {path}: {exc}") from exc
    if path.suffix == ".zst":
        try:
            return _unzstd(data, path)
        except SymbolError:
            raise
        except Exception as exc:    # each decompressor has its own error class
            raise SymbolError(f"cannot decompress {path}: {exc}") from exc
    return data


def _module_name(file_name: str) -> str | None:
    for suffix in MODULE_SUFFIXES:
        if file_name.endswith(suffix):
            return file_name[:-len(suffix)].replace("-", "_")
    return None


def _modinfo(module: str) -> Path | None:
    try:
        run = subprocess.run(["modinfo", "-n", module], capture_output=True, text=True)
    except OSError:                 # no modinfo (kmod)
        return None
    path = Path(run.stdout.strip()) if run.returncode == 0 else None
    return path if path and path.is_file() else None


def _modules_dep(module: str, release: str) -> Path | None:
    top = MODULES_DIR / release
    try:
        dep = (top / "modules.dep").read_text()
    except OSError:
        return None
    want = module.replace("-", "_")
    for line in dep.splitlines():
        name = line.partition(":")[0].strip()
        if name and _module_name(name.rpartition("/")[2]) == want:
            path = top / name        # absolute if name is
            return path if path.is_file() else None
    return None


def module_file(module: str) -> Path | None:
    """The file of a module of the running kernel (.ko, .ko.xz, .ko.zst or
    .ko.gz): as modinfo -n finds it, else from modules.dep; None if neither has it."""
    return _modinfo(module) or _modules_dep(module, os.uname().release)


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
    """The size of a data object of a loaded module, from its module file;
    None if no file of the module is found, SymbolError (saying why) if the
    file cannot be read or has no such object."""
    path = module_file(module)
    if path is None:
        return None
    size = _module_sizes(path).get(name)
    if size is None:
        raise SymbolError(f"{path} has no data object {name}")
    return size


@functools.lru_cache(maxsize=4)
def _module_sizes(path: Path) -> dict[str, int]:
    elf = read_module(path)
    try:
        return elf_object_sizes(elf)
    except (struct.error, ValueError, IndexError) as exc:
        raise SymbolError(f"{path}: not a readable ELF file ({exc})") from exc
    except SymbolError as exc:
        raise SymbolError(f"{path}: {exc}") from exc
