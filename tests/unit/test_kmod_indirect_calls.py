"""No function of the helper module calls through a probe's address (issue 12, item 6).

On kernels built with CONFIG_X86_KERNEL_IBT, running on CPUs with CET, an
indirect call must land on an ENDBR instruction; the address a kprobe (or an
ftrace ops) records for the probed function is not guaranteed to be one, so
calling "the original" through it traps.  The test bed cannot show that
trap (QEMU's TCG has no CET), so this test reads the built module instead:
it fails if a function both makes an indirect call (a retpoline thunk call
or jump, ``call *%reg``, or ``call *mem`` through a probe object) and
references a ``struct kprobe`` / ``struct kretprobe`` / ``struct ftrace_ops``
object of the module.  The probe objects are the data symbols the C sources
declare with those types.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_kmod_build import kbuild_dir

REPO = Path(__file__).resolve().parents[2]
KMOD = REPO / "kmod"
PROBE_TYPES = ("kprobe", "kretprobe", "ftrace_ops")
# "static struct kprobe ng_fault_probe = {", "struct ftrace_ops foo;", ...
# (a pointer such as "struct kprobe *p" does not match)
DECL = re.compile(r"\bstruct\s+(" + "|".join(PROBE_TYPES) + r")\s+(\w+)\s*(?:__\w+\s*)*[=;\[]")
FUNC = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")
RELOC = re.compile(r"^\s*([0-9a-f]+): (R_X86_64_\w+)\s+(\S+?)([+-]0x[0-9a-f]+)?$")
THUNK = re.compile(r"__x86_(?:indirect_thunk|indirect_jump_thunk|indirect_call_thunk)")


@dataclass
class Obj:
    name: str
    section: str
    value: int
    size: int


def probe_names(src: Path) -> set[str]:
    names: set[str] = set()
    for c in sorted(src.glob("*.c")):
        text = re.sub(r"/\*.*?\*/", "", c.read_text(), flags=re.S)
        names.update(m.group(2) for m in DECL.finditer(text))
    return names


def section_vmas(ko: Path) -> dict[str, int]:
    out = subprocess.run(["objdump", "-h", str(ko)], capture_output=True, text=True,
                         check=True).stdout
    vmas = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0].isdigit():
            vmas[f[1]] = int(f[3], 16)
    return vmas


def data_objects(ko: Path) -> list[Obj]:
    """Data symbols, with values made relative to their section (a module's
    sections may have nonzero addresses; relocations count from the start)."""
    out = subprocess.run(["objdump", "-t", str(ko)], capture_output=True, text=True,
                         check=True).stdout
    vmas = section_vmas(ko)
    objs = []
    for line in out.splitlines():
        # 0000000000000040 l     O .data	0000000000000080 ng_fault_probe
        m = re.match(r"^([0-9a-f]+) .{7} (\S+)\t([0-9a-f]+) (\S+)$", line)
        if m and " O " in line:
            sec = m.group(2)
            objs.append(Obj(m.group(4), sec, int(m.group(1), 16) - vmas.get(sec, 0),
                            int(m.group(3), 16)))
    return objs


def reloc_target(kind: str, sym: str, addend: int, objs: list[Obj]) -> str:
    """The data object a relocation points into (its name), or the symbol."""
    if not sym.startswith("."):
        return sym
    # section-relative (static objects): a PC-relative field access is
    # S + A - P with A = offset - 4 (or less if an immediate follows)
    cands = [addend] if kind in ("R_X86_64_32S", "R_X86_64_32", "R_X86_64_64") else \
        [addend + 4, addend + 5, addend + 6, addend + 8]
    for off in cands:
        for o in objs:
            if o.section == sym and o.value <= off < o.value + o.size:
                return o.name
    return f"{sym}{addend:+#x}"


@dataclass
class Func:
    name: str
    indirect: list[str]
    refs: set[str]


def functions(ko: Path, objs: list[Obj], probes: set[str]) -> list[Func]:
    out = subprocess.run(["objdump", "-dr", "--no-show-raw-insn", str(ko)],
                         capture_output=True, text=True, check=True).stdout
    funcs: list[Func] = []
    cur: Func | None = None
    last_insn = ""
    for line in out.splitlines():
        if m := FUNC.match(line):
            cur = Func(m.group(1), [], set())
            funcs.append(cur)
            continue
        if cur is None:
            continue
        if m := RELOC.match(line):
            kind, sym = m.group(2), m.group(3)
            addend = int(m.group(4), 16) if m.group(4) else 0
            target = reloc_target(kind, sym, addend, objs)
            cur.refs.add(target)
            if THUNK.search(sym) and re.match(r"(call|jmp)", last_insn):
                cur.indirect.append(f"{last_insn.split()[0]} {sym}")
            elif re.match(r"(call|jmp)\s+\*0x0\(%rip\)", last_insn) and target in probes:
                cur.indirect.append(f"{last_insn.split()[0]} *{target}")
            continue
        m = re.match(r"^\s*[0-9a-f]+:\s+(\S.*)$", line)
        if m:
            last_insn = m.group(1).strip()
            if re.match(r"(call|jmp)\s+\*%", last_insn):
                cur.indirect.append(last_insn)
    return funcs


@pytest.fixture(scope="module")
def built_ko(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("kmod") / "src"
    shutil.copytree(KMOD, work, ignore=shutil.ignore_patterns("*.o", "*.ko", "*.mod*", ".*"))
    out = subprocess.run(["make", "-C", str(kbuild_dir()), f"M={work}", "modules"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    kos = list(work.glob("*.ko"))
    assert len(kos) == 1, kos
    return kos[0]


def test_probe_objects_found(built_ko):
    """The parser sees the module's probe objects (else the check below is empty)."""
    probes = probe_names(KMOD)
    assert probes, "no struct kprobe/kretprobe/ftrace_ops declared in kmod/*.c?"
    names = {o.name for o in data_objects(built_ko)}
    missing = probes - names
    assert not missing, f"declared but not in the symbol table: {sorted(missing)}"


def test_no_indirect_call_through_a_probe_address(built_ko):
    probes = probe_names(KMOD)
    bad = []
    for f in functions(built_ko, data_objects(built_ko), probes):
        touched = sorted(f.refs & probes)
        if f.indirect and touched:
            bad.append(f"{f.name}: indirect {f.indirect} and references {touched}")
    assert not bad, ("functions that call through a pointer and read a probe object "
                     "(an IBT trap when the pointer is the probe's address):\n"
                     + "\n".join(bad))


def test_detector_sees_a_call_through_a_probe(tmp_path):
    """The check itself: a module that calls kp.addr is caught."""
    src = tmp_path / "m"
    src.mkdir()
    (src / "Kbuild").write_text("obj-m := ngt.o\n")
    (src / "ngt.c").write_text("""\
// SPDX-License-Identifier: GPL-2.0
#include <linux/module.h>
#include <linux/kprobes.h>
static struct kprobe ngt_probe = { .symbol_name = "vfree" };
noinline void ngt_call(const void *p)
{
	((void (*)(const void *))ngt_probe.addr)(p);
}
EXPORT_SYMBOL_GPL(ngt_call);
static int __init ngt_init(void) { return register_kprobe(&ngt_probe); }
module_init(ngt_init);
MODULE_LICENSE("GPL");
""")
    out = subprocess.run(["make", "-C", str(kbuild_dir()), f"M={src}", "modules"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    ko = src / "ngt.ko"
    probes = probe_names(src)
    assert probes == {"ngt_probe"}
    funcs = {f.name: f for f in functions(ko, data_objects(ko), probes)}
    assert funcs["ngt_call"].indirect and "ngt_probe" in funcs["ngt_call"].refs
    assert not any(f.indirect for n, f in funcs.items() if n != "ngt_call")
