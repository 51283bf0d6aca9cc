"""The struct member offsets the interrupt and DMA programs read
(mmiotrace_ng/tracer/layout.py, from a kernel's BTF) against the kernel's own
headers: for each installed kernel, its BTF is read out of its vmlinuz and a
small module built with its headers asserts offsetof() == each offset found."""

from __future__ import annotations

import glob
import lzma
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from ng_require import missing

from mmiotrace_ng.common.btf import BTF
from mmiotrace_ng.tracer import layout

KERNELS = sorted(Path(p).parent.name for p in glob.glob("/lib/modules/*/build"))
# offsets that exist only with a kernel option
NEEDS = {"NG_OFF_IRQ_DESC_MSI_DESC": "CONFIG_GENERIC_MSI_IRQ",
         "NG_OFF_MSI_DESC_DEV": "CONFIG_GENERIC_MSI_IRQ",
         "NG_OFF_SG_DMA_LENGTH": "CONFIG_NEED_SG_DMA_LENGTH"}
HEADERS = ("linux/module.h", "linux/device.h", "linux/pci.h", "linux/interrupt.h", "linux/irq.h",
           "linux/irqdesc.h", "linux/msi.h", "linux/scatterlist.h")
# compressed payloads of a bzImage: magic -> how to unpack one (trailing bytes allowed)
XZ, GZIP, ZSTD = b"\xfd7zXZ\x00", b"\x1f\x8b\x08", b"\x28\xb5\x2f\xfd"


def unpack(payload: bytes, magic: bytes) -> bytes:
    if magic == XZ:
        return lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(payload)
    if magic == GZIP:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(payload)
    zstd = shutil.which("zstd")
    if zstd is None:
        missing("zstd (to read a zstd-compressed vmlinuz)")
    # zstd stops with an error at the bytes after the frame, having written it
    return subprocess.run([zstd, "-dc"], input=payload, capture_output=True).stdout


def elf_section(elf: bytes, name: str) -> bytes | None:
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<3H", elf, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        sh_name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", elf,
                                                                      shoff + i * shentsize)
        return sh_name, off, size

    _n, stroff, _s = header(shstrndx)
    for i in range(shnum):
        sh_name, off, size = header(i)
        if elf[stroff + sh_name:elf.index(b"\0", stroff + sh_name)].decode() == name:
            return elf[off:off + size]
    return None


def vmlinuz_btf(path: Path) -> bytes:
    """The .BTF section of the vmlinux packed in a bzImage."""
    data = path.read_bytes()
    for off, magic in sorted((data.find(m), m) for m in (XZ, GZIP, ZSTD) if data.find(m) > 0):
        try:
            elf = unpack(data[off:], magic)
        except (lzma.LZMAError, zlib.error):
            continue
        if elf.startswith(b"\x7fELF"):
            section = elf_section(elf, ".BTF")
            assert section, f"{path}: its vmlinux has no .BTF section"
            return section
    pytest.fail(f"{path}: no compressed vmlinux found in it")


def check_source(defines: list[str]) -> str:
    """A module that fails to build unless each offset is the headers' and
    each option's offset is there exactly when the option is."""
    found = {d[2:].split("=")[0] for d in defines}
    lines = [f"#include <{h}>" for h in HEADERS]
    for macro, (struct_name, path) in layout.OFFSETS.items():
        option = NEEDS.get(macro)
        check = f"static_assert(offsetof(struct {struct_name}, {path}) == {macro});"
        if option is None:
            assert macro in found, f"the kernel's BTF has no {struct_name}.{path}"
            lines.append(check)
        else:
            lines += [f"#if defined({option}) != defined({macro})",
                      f"#error \"{macro} found in the BTF but {option} says otherwise\"",
                      "#endif", f"#ifdef {macro}", check, "#endif"]
    for macro, struct_name in layout.SIZES.items():
        lines.append(f"static_assert(sizeof(struct {struct_name}) == {macro});")
    lines += ["MODULE_LICENSE(\"GPL\");", ""]
    return "\n".join(lines)


@pytest.mark.parametrize("kver", KERNELS or ["none"])
def test_offsets_from_btf_are_those_of_the_kernels_headers(kver, tmp_path):
    kdir = Path("/lib/modules") / kver / "build"
    vmlinuz = Path("/boot") / f"vmlinuz-{kver}"
    if not kdir.is_dir() or not vmlinuz.exists():
        missing(f"no kernel headers and image for {kver} (linux-headers-amd64, linux-image-amd64)")
    defines = layout.defines(BTF(vmlinuz_btf(vmlinuz)))
    (tmp_path / "layout_check.c").write_text(check_source(defines))
    (tmp_path / "Makefile").write_text("obj-m := layout_check.o\n"
                                       f"ccflags-y := {' '.join(defines)}\n")
    out = subprocess.run(["make", "-C", str(kdir), f"M={tmp_path}", "modules"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
