"""A module's object sizes from its file, plain or compressed as the
distributions ship them (.ko.xz, .ko.zst, .ko.gz), and where the file is
found (modinfo -n, else modules.dep)."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from ng_require import missing

from mmiotrace_ng.common import symbols
from mmiotrace_ng.common.symbols import (
    SymbolError,
    elf_object_sizes,
    module_object_size,
    read_module,
)

SOURCE = r"""
struct pair { long a; char b[9]; };
int watched_int = 1;
char name_buf[37] = "edu";
struct pair a_pair;
__attribute__((used)) static short small_static;
unsigned long long counters[3][5];
void touch(void) { small_static++; }
"""
# the sizes C gives these on x86-64 (struct pair: 8 + 9, padded to 8)
WANT = {"watched_int": 4, "name_buf": 37, "a_pair": 24, "small_static": 2, "counters": 120}


@pytest.fixture(scope="module")
def ko(tmp_path_factory) -> Path:
    """A relocatable object like a .ko, and its compressed copies beside it."""
    if not shutil.which("gcc"):
        missing("gcc")
    top = tmp_path_factory.mktemp("ko")
    (top / "fake.c").write_text(SOURCE)
    subprocess.run(["gcc", "-c", "-O2", "-fno-common", "-o", str(top / "fake.ko"),
                    str(top / "fake.c")], check=True, capture_output=True)
    return top / "fake.ko"


def compressed(ko: Path, suffix: str) -> Path:
    out = ko.with_name(ko.name + suffix)
    if out.exists():
        return out
    # as the kernel's Makefile.modinst compresses modules
    tool = {".xz": ["xz", "--check=crc32", "--lzma2=dict=1MiB"], ".zst": ["zstd", "-T0", "-q"],
            ".gz": ["gzip", "-n"]}[suffix]
    if not shutil.which(tool[0]):
        missing(f"{tool[0]} (to compress the test module)")
    with ko.open("rb") as src, out.open("wb") as dst:
        subprocess.run([*tool, "-c"], stdin=src, stdout=dst, check=True)
    return out


def test_the_plain_object_sizes_are_those_of_c(ko):
    got = elf_object_sizes(ko.read_bytes())
    assert {k: got.get(k) for k in WANT} == WANT


@pytest.mark.parametrize("suffix", [".xz", ".zst", ".gz"])
def test_each_compressed_form_reads_as_the_plain_file(ko, suffix):
    path = compressed(ko, suffix)
    assert path.read_bytes()[:4] != b"\x7fELF"
    assert read_module(path) == ko.read_bytes()
    got = elf_object_sizes(read_module(path))
    assert {k: got.get(k) for k in WANT} == WANT


def no_zstd_modules(monkeypatch) -> None:
    """Python without compression.zstd and zstandard (a None entry makes
    the import fail; the package too: on 3.14, once compression.zstd was
    imported, `from compression import zstd` finds it as an attribute)."""
    monkeypatch.setitem(sys.modules, "compression", None)
    monkeypatch.setitem(sys.modules, "compression.zstd", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)


def unzstd_command(data: bytes) -> tuple[bytes, bool]:
    run = subprocess.run(["zstd", "-dcq"], input=data, capture_output=True)
    return run.stdout, run.returncode == 0


def fake_compression_zstd() -> types.ModuleType:
    """Python 3.14's compression.zstd as far as it is used: decompress(),
    raising on a bad stream (ZstdError)."""
    def decompress(data: bytes) -> bytes:
        out, whole = unzstd_command(data)
        if not whole:
            raise ValueError("Compressed data ended before the end-of-stream marker")
        return out
    zstd = types.ModuleType("compression.zstd")
    zstd.decompress = decompress  # type: ignore[attr-defined]
    return zstd


def fake_zstandard() -> types.ModuleType:
    """zstandard as far as it is used: a decompressobj() that returns what
    it could and says eof only for a whole stream."""
    class Obj:
        eof = False

        def decompress(self, data: bytes) -> bytes:
            out, self.eof = unzstd_command(data)
            return out

    class ZstdDecompressor:
        def decompressobj(self) -> Obj:
            return Obj()
    mod = types.ModuleType("zstandard")
    mod.ZstdDecompressor = ZstdDecompressor  # type: ignore[attr-defined]
    return mod


@pytest.fixture(params=["compression.zstd", "zstandard", "zstd command"])
def zstd_way(request, monkeypatch) -> str:
    """Each way of decompressing zstd, alone: the real Python module where
    this Python has it, else a stand-in for it built on the zstd command."""
    way = request.param
    if not shutil.which("zstd"):
        missing("zstd (the command)")
    no_zstd_modules(monkeypatch)
    if way == "compression.zstd":
        try:
            from compression import zstd  # type: ignore[import-not-found]
        except ImportError:
            zstd = fake_compression_zstd()
        package = types.ModuleType("compression")
        package.zstd = zstd  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "compression", package)
        monkeypatch.setitem(sys.modules, "compression.zstd", zstd)
    elif way == "zstandard":
        monkeypatch.delitem(sys.modules, "zstandard")
        try:
            import zstandard
        except ImportError:
            zstandard = fake_zstandard()
        monkeypatch.setitem(sys.modules, "zstandard", zstandard)
    if way != "zstd command":
        monkeypatch.setattr(symbols.shutil, "which", lambda _name: None)
    return way


def test_zst_each_way(ko, zstd_way):
    assert read_module(compressed(ko, ".zst")) == ko.read_bytes()


def test_a_cut_zst_each_way_is_an_error(ko, tmp_path, zstd_way):
    good = compressed(ko, ".zst").read_bytes()
    bad = tmp_path / "fake.ko.zst"
    bad.write_bytes(good[:len(good) // 2])
    with pytest.raises(SymbolError, match="fake.ko.zst"):
        read_module(bad)


def test_zst_with_no_decompressor_says_so(ko, monkeypatch):
    path = compressed(ko, ".zst")
    no_zstd_modules(monkeypatch)
    monkeypatch.setattr(symbols.shutil, "which", lambda _name: None)
    with pytest.raises(SymbolError) as exc:
        read_module(path)
    msg = str(exc.value)
    assert str(path) in msg and "zstd" in msg and "apt-get install zstd" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("suffix", [".xz", ".gz"])
def test_a_damaged_compressed_file_is_an_error_not_a_size(ko, tmp_path, suffix):
    good = compressed(ko, suffix).read_bytes()
    bad = tmp_path / f"fake.ko{suffix}"
    bad.write_bytes(good[:len(good) // 2])
    with pytest.raises(SymbolError, match="fake.ko"):
        read_module(bad)


def test_a_gzip_file_that_is_not_elf(tmp_path):
    path = tmp_path / "junk.ko.gz"
    path.write_bytes(gzip.compress(b"not an ELF file at all" * 4))
    symbols._module_sizes.cache_clear()
    with pytest.raises(SymbolError, match="not a 64-bit little-endian ELF"):
        symbols._module_sizes(path)


@pytest.fixture
def modules_dir(tmp_path, monkeypatch, ko) -> Path:
    """/lib/modules/$(uname -r) with a modules.dep naming the test object,
    as the distributions ship it, and no modinfo to ask."""
    top = tmp_path / os.uname().release
    (top / "kernel/drivers/misc").mkdir(parents=True)
    monkeypatch.setattr(symbols, "MODULES_DIR", tmp_path)
    monkeypatch.setattr(symbols, "_modinfo", lambda _module: None)
    symbols._module_sizes.cache_clear()
    return top


@pytest.mark.parametrize("suffix", ["", ".xz", ".zst", ".gz"])
def test_module_object_size_from_modules_dep(modules_dir, ko, suffix):
    rel = f"kernel/drivers/misc/edu-fake.ko{suffix}"
    shutil.copy(compressed(ko, suffix) if suffix else ko, modules_dir / rel)
    (modules_dir / "modules.dep").write_text(
        "kernel/drivers/net/e1000.ko.xz:\n"
        f"{rel}: kernel/drivers/net/e1000.ko.xz\n")
    # kallsyms spells the module with '_' where its file name has '-'
    assert symbols.module_file("edu_fake") == modules_dir / rel
    assert module_object_size("edu_fake", "name_buf") == 37
    assert module_object_size("edu_fake", "a_pair") == 24
    with pytest.raises(SymbolError, match="has no data object touch"):
        module_object_size("edu_fake", "touch")      # a function, not data
    assert module_object_size("e1000", "x") is None  # listed, but no file
    assert module_object_size("absent", "x") is None


def test_modinfo_comes_first(modules_dir, ko, monkeypatch):
    (modules_dir / "modules.dep").write_text("kernel/drivers/misc/other.ko:\n")
    monkeypatch.setattr(symbols, "_modinfo",
                        lambda module: ko if module == "fake" else None)
    assert module_object_size("fake", "watched_int") == 4


def test_modinfo_missing_is_no_file(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert symbols._modinfo("e1000") is None
