"""Host tests for the kernel module's decoder/emulator (kmod/ng_decode.c).

The C code is compiled into tests/unit/decode_harness.c (a small program
driven over stdin/stdout, see its header) in a temporary directory.

* decode: a programmatic corpus of several thousand encodings is decoded by
  ng_decode() and by capstone, and both are compared with what the
  generator encoded; must-reject encodings, truncated buffers (the harness
  puts the bytes right before an inaccessible page, so an over-read is
  caught) and a structured fuzz (ng_decode accepts exactly what it should).
* emulate: ng_emulate() against an independent Python model of the x86
  semantics (register writes, rep movs/stos with DF, rcx, partial runs,
  failing memory accesses).
* compat: ng_compat() against the kernel's own arch/x86/mm/pf_in.c,
  compiled into the harness as the oracle, for every corpus instruction,
  the fuzz and random bytes, with random registers.
* the kernel build of kmod/ng_decode.c (W=1, no warnings) and checkpatch.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import capstone
import pytest
from capstone import x86
from ng_require import missing

ROOT = Path(__file__).resolve().parents[2]
KMOD = ROOT / "kmod"
HARNESS_SRC = Path(__file__).with_name("decode_harness.c")
# the kernel under test (tests/run sets MMIOTNG_KVER; a release's root has
# its own kernels), Debian 12's, the running one
KBUILD_DIRS = [Path("/lib/modules") / v / "build" for v in (
    os.environ.get("MMIOTNG_KVER", "6.1.0-57-amd64"), "6.1.0-57-amd64", os.uname().release)]
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-DNG_DECODE_HOST"]

M64 = (1 << 64) - 1
EINVAL, EFAULT, EIO, ENXIO = 22, 14, 5, 6

# enum ng_kind
LOAD, STORE, STORE_IMM, MOVZX, MOVSX, MOVS, STOS = range(1, 8)
KIND_NAMES = {LOAD: "load", STORE: "store", STORE_IMM: "store_imm",
              MOVZX: "movzx", MOVSX: "movsx", MOVS: "movs", STOS: "stos"}
REG_RIP, REG_NONE = 16, 0xFF
REX_W, REX_R, REX_X, REX_B = 8, 4, 2, 1
OP_READ, OP_WRITE, OP_UNKNOWN = 0, 1, 2
DF = 0x400

# harness register order
REGS = ["rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
        "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip", "flags"]
IP, FLAGS = 16, 17
RAX, RCX, RSI, RDI = 0, 1, 6, 7

R64 = REGS[:16]
R32 = ["eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi"] + \
    [f"r{i}d" for i in range(8, 16)]
R16 = ["ax", "cx", "dx", "bx", "sp", "bp", "si", "di"] + \
    [f"r{i}w" for i in range(8, 16)]
R8 = ["al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil"] + \
    [f"r{i}b" for i in range(8, 16)]
HIGH8 = {4: "ah", 5: "ch", 6: "dh", 7: "bh"}
SEG_NAMES = {0x2E: "cs", 0x36: "ss", 0x3E: "ds", 0x26: "es"}
LEGACY = {0x66, 0x67, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65, 0xF0, 0xF2, 0xF3}


def reg_name(no: int, width: int, high8: bool = False) -> str:
    if high8:
        return HIGH8[no]
    return {1: R8, 2: R16, 4: R32, 8: R64}[width][no]


def sext(v: int, width: int) -> int:
    bits = 8 * width
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def mask(width: int) -> int:
    return (1 << (8 * width)) - 1


# --------------------------------------------------------------------------
# Locating the kernel sources and building the harness


class Harness:
    def __init__(self, exe: Path, oracle: bool):
        self.exe = exe
        self.oracle = oracle

    def run(self, lines: list[str]) -> list[str]:
        if not lines:
            return []
        proc = subprocess.run([str(self.exe)], input="\n".join(lines) + "\n",
                              check=False, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"harness died: {proc.returncode} {proc.stderr}"
        out = proc.stdout.split("\n")[:-1]
        assert len(out) == len(lines), "harness lost lines"
        return out


def build_harness(outdir: Path, pf_in: Path | None) -> Harness:
    cmd = ["gcc", *CFLAGS, f"-I{KMOD}", "-o", str(outdir / "decode_harness")]
    if pf_in is not None:
        stub = outdir / "stub"
        (stub / "linux").mkdir(parents=True, exist_ok=True)
        # pf_in.c includes <linux/ptrace.h> for struct pt_regs, which the
        # harness gets from ng_decode.h; the harness defines the pr stubs.
        (stub / "linux" / "ptrace.h").write_text("/* stub */\n")
        cmd += [f"-I{stub}", f'-DNG_ORACLE_PF_IN="{pf_in}"']
    cmd += [str(HARNESS_SRC), str(KMOD / "ng_decode.c")]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert proc.returncode == 0, f"harness build failed:\n{' '.join(cmd)}\n{proc.stderr}"
    assert proc.stderr == "", proc.stderr
    return Harness(outdir / "decode_harness", pf_in is not None)


@pytest.fixture(scope="session")
def harness(tmp_path_factory, kernel_source) -> Harness:
    return build_harness(tmp_path_factory.mktemp("harness"),
                         kernel_source / "arch/x86/mm/pf_in.c")


@pytest.fixture(scope="session")
def oracle(harness) -> Harness:
    assert harness.oracle
    return harness


@pytest.fixture(scope="session")
def md():
    m = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    m.detail = True
    return m


# --------------------------------------------------------------------------
# The corpus


@dataclass(frozen=True)
class Spec:
    """An encoding, with what it means (from the generator, not the C)."""
    code: bytes
    form: str
    kind: int
    opcode: int
    mem_width: int
    reg_width: int = 0
    reg: int = REG_NONE
    high8: bool = False
    base: int = REG_NONE
    index: int = REG_NONE
    scale: int = 1
    disp: int = 0
    imm: int = 0
    rep: bool = False
    seg: int = 0

    def __str__(self):
        return f"{self.code.hex(' ')} ({self.form})"


DISP8 = [0, 1, -1, 0x7F, -0x80, 0x10, -0x10]
DISP32 = [0, 1, -1, 0x7FFFFFFF, -0x80000000, 0x1000, -0x1000]


def pick_disp(rng: random.Random, size: int) -> int:
    if size == 1:
        return rng.choice(DISP8) if rng.random() < 0.4 else rng.randint(-128, 127)
    return rng.choice(DISP32) if rng.random() < 0.4 else rng.randint(-2**31, 2**31 - 1)


@dataclass
class Mem:
    """A memory operand: encoding and meaning."""
    mod: int
    rm: int
    rex_xb: int
    tail: bytes          # SIB and displacement
    base: int
    index: int
    scale: int
    disp: int


def mem_operand(rng: random.Random, mod: int, rm: int, rex_b: int,
                sib: tuple[int, int, int, int] | None = None) -> Mem:
    """mod 0..2, rm 0..7; sib = (scale bits, index 0-15, base 0-7)."""
    tail = b""
    index, scale, disp_size = REG_NONE, 1, {0: 0, 1: 1, 2: 4}[mod]
    rex_xb = REX_B if rex_b else 0
    if rm == 4:
        if sib is None:
            sib = (rng.randrange(4), rng.randrange(16), rng.randrange(8))
        ss, idx, b3 = sib
        rex_xb |= REX_X if idx & 8 else 0
        tail = bytes([ss << 6 | (idx & 7) << 3 | b3])
        scale = 1 << ss
        index = REG_NONE if idx == 4 else idx
        if b3 == 5 and mod == 0:
            base, disp_size = REG_NONE, 4
        else:
            base = b3 | (8 if rex_b else 0)
    elif rm == 5 and mod == 0:
        base, disp_size = REG_RIP, 4
    else:
        base = rm | (8 if rex_b else 0)
    disp = pick_disp(rng, disp_size) if disp_size else 0
    if disp_size:
        tail += (disp & mask(disp_size)).to_bytes(disp_size, "little")
    return Mem(mod, rm, rex_xb, tail, base, index, scale, disp)


# (name, opcode bytes, kind, mem_width, reg_width, 66, REX.W, imm size)
def modrm_forms():
    forms = []
    for p66, w in [(False, False), (True, False), (False, True)]:
        sfx = ("/66" if p66 else "") + ("/W" if w else "")
        forms += [("mov m8,r8" + sfx, b"\x88", STORE, 1, 1, p66, w, 0),
                  ("mov r8,m8" + sfx, b"\x8a", LOAD, 1, 1, p66, w, 0),
                  ("mov m8,imm8" + sfx, b"\xc6", STORE_IMM, 1, 0, p66, w, 1)]
    for p66, w in [(True, False), (False, False), (False, True), (True, True)]:
        o = 8 if w else (2 if p66 else 4)
        sfx = f"{o * 8}" + ("/66" if p66 else "")
        forms += [("mov m,r" + sfx, b"\x89", STORE, o, o, p66, w, 0),
                  ("mov r,m" + sfx, b"\x8b", LOAD, o, o, p66, w, 0),
                  ("mov m,imm" + sfx, b"\xc7", STORE_IMM, o, 0, p66, w, 2 if o == 2 else 4),
                  ("movzx r,m8" + sfx, b"\x0f\xb6", MOVZX, 1, o, p66, w, 0),
                  ("movzx r,m16" + sfx, b"\x0f\xb7", MOVZX, 2, o, p66, w, 0),
                  ("movsx r,m8" + sfx, b"\x0f\xbe", MOVSX, 1, o, p66, w, 0),
                  ("movsx r,m16" + sfx, b"\x0f\xbf", MOVSX, 2, o, p66, w, 0)]
        if w:
            forms.append(("movsxd r64,m32" + sfx, b"\x63", MOVSX, 4, 8, p66, w, 0))
    return forms


def encode_modrm(rng: random.Random, form, reg: int, mem: Mem,
                 decorate: bool = True) -> Spec:
    name, opc, kind, mw, rw, p66, w, immsz = form
    if immsz:
        reg = 0         # C6 /0, C7 /0
    legacy = [0x66] if p66 else []
    seg = 0
    if decorate and rng.random() < 0.3:
        seg = rng.choice(list(SEG_NAMES))
        legacy.append(seg)
    if decorate and rng.random() < 0.1:
        legacy.append(0x66 if p66 else 0x2E)     # a repeated prefix
        if not p66:
            seg = seg or 0x2E
            if legacy.index(0x2E) < legacy.index(seg):
                seg = 0x2E
    rng.shuffle(legacy)
    if seg:     # the last segment prefix is the one reported
        seg = [b for b in legacy if b in SEG_NAMES][-1]
    rex = (REX_W if w else 0) | (REX_R if reg & 8 else 0) | mem.rex_xb
    if immsz and decorate and rng.random() < 0.2:
        rex |= REX_R                            # ignored for C6/C7 /0
    force = decorate and rng.random() < 0.2
    rex_present = bool(rex) or force
    pre = bytes(legacy)
    if decorate and legacy and rng.random() < 0.15:
        # a REX followed by a legacy prefix is ignored
        pre = bytes([0x40 | rng.randrange(16)]) + pre
    if rex_present and decorate and rng.random() < 0.08:
        pre += bytes([0x40 | rng.randrange(16)])   # superseded by the next REX
    if rex_present:
        pre += bytes([0x40 | rex])
    modrm = mem.mod << 6 | (reg & 7) << 3 | mem.rm
    imm = 0
    imm_bytes = b""
    if immsz:
        raw = rng.choice([0, mask(immsz), 1 << (8 * immsz - 1), rng.getrandbits(8 * immsz)])
        imm_bytes = raw.to_bytes(immsz, "little")
        imm = sext(raw, 4) & M64 if mw == 8 else raw
    code = pre + opc + bytes([modrm]) + mem.tail + imm_bytes
    high8 = rw == 1 and not rex_present and 4 <= reg <= 7
    return Spec(code=code, form=name, kind=kind, opcode=opc[-1], mem_width=mw,
                reg_width=rw, reg=REG_NONE if immsz else reg, high8=high8,
                base=mem.base, index=mem.index, scale=mem.scale,
                disp=mem.disp, imm=imm, seg=seg)


ADDR_CASES = [(mod, rm, b) for mod in range(3) for rm in range(8) for b in range(2)]


def string_corpus() -> list[Spec]:
    specs = []
    rng = random.Random(7)
    for opc in (0xA4, 0xA5, 0xAA, 0xAB):
        for p66 in (False, True):
            for rexb in (None, 0x40, 0x48, 0x41, 0x4F, 0x46):
                for rep in (False, True):
                    for seg in (0, 0x2E, 0x3E, 0x26, 0x36):
                        legacy = ([0x66] if p66 else []) + ([0xF3] if rep else []) + \
                            ([seg] if seg else [])
                        rng.shuffle(legacy)
                        pre = bytes(legacy)
                        if legacy and rng.random() < 0.2:
                            pre = bytes([0x40 | rng.randrange(16)]) + pre
                        w = bool(rexb and rexb & REX_W)
                        mw = 1 if opc in (0xA4, 0xAA) else (8 if w else (2 if p66 else 4))
                        movs = opc in (0xA4, 0xA5)
                        code = pre + (bytes([rexb]) if rexb else b"") + bytes([opc])
                        specs.append(Spec(
                            code=code, form=("movs" if movs else "stos") + f"{mw * 8}",
                            kind=MOVS if movs else STOS, opcode=opc, mem_width=mw,
                            reg_width=0 if movs else mw, reg=REG_NONE if movs else 0,
                            rep=rep, seg=seg))
    return specs


def build_corpus() -> list[Spec]:
    rng = random.Random(1234)
    specs = []
    forms = modrm_forms()
    for fi, form in enumerate(forms):
        for reg in range(16):
            for j in range(12):
                mod, rm, b = ADDR_CASES[(reg * 12 + j + fi) % len(ADDR_CASES)]
                specs.append(encode_modrm(rng, form, reg, mem_operand(rng, mod, rm, b)))
            for _ in range(4):
                mod, b = rng.randrange(3), rng.randrange(2)
                specs.append(encode_modrm(rng, form, reg, mem_operand(rng, mod, 4, b)))
            # RIP-relative, REX.B set or not
            specs.append(encode_modrm(rng, form, reg, mem_operand(rng, 0, 5, reg & 1)))
    # every SIB byte with every mod and REX.X/REX.B, on two forms
    load32 = next(f for f in forms if f[0] == "mov r,m32")
    store8 = next(f for f in forms if f[0] == "mov m8,r8")
    for mod in range(3):
        for ss in range(4):
            for idx in range(16):
                for b3 in range(8):
                    for b in range(2):
                        form = load32 if (idx + b3 + b) % 2 else store8
                        specs.append(encode_modrm(
                            rng, form, rng.randrange(16),
                            mem_operand(rng, mod, 4, b, (ss, idx, b3))))
    specs += string_corpus()
    # the longest form: 15 bytes
    specs.append(Spec(code=bytes.fromhex("2e3e2648c78424") + (0x12345678).to_bytes(4, "little")
                      + bytes.fromhex("fffffff7"), form="15 bytes", kind=STORE_IMM,
                      opcode=0xC7, mem_width=8, base=4, disp=0x12345678,
                      imm=0xFFFFFFFFF7FFFFFF,
                      seg=0x26))
    assert all(len(s.code) <= 15 for s in specs)
    return specs


CORPUS = build_corpus()
MODRM_CORPUS = [s for s in CORPUS if s.kind not in (MOVS, STOS)]
STRING_CORPUS = [s for s in CORPUS if s.kind in (MOVS, STOS)]


def test_corpus_size():
    assert len(CORPUS) > 5000
    assert len(STRING_CORPUS) >= 400
    assert len({s.code for s in CORPUS}) > 0.95 * len(CORPUS)


# --------------------------------------------------------------------------
# Decoding


FIELDS = ["rc", "len", "kind", "opcode", "mem_width", "reg_width", "reg", "high8",
          "rex", "rex_bits", "opsize", "rep", "seg", "has_modrm", "modrm",
          "has_sib", "sib", "base", "index", "scale", "disp", "imm"]
HEXFIELDS = {"opcode", "rex_bits", "seg", "modrm", "sib", "imm"}


def parse_decode(line: str) -> dict:
    parts = line.split()
    if len(parts) == 1:
        return {"rc": int(parts[0])}
    assert len(parts) == len(FIELDS), line
    return {k: int(v, 16 if k in HEXFIELDS else 10) for k, v in zip(FIELDS, parts, strict=True)}


def decode_all(harness: Harness, codes: list[bytes]) -> list[dict]:
    out = harness.run([f"D {c.hex() or '-'}" for c in codes])
    return [parse_decode(line) for line in out]


def cs_view(md, code: bytes):
    """capstone's decoding, normalised; None if it does not decode."""
    insns = list(md.disasm(code, 0x1000, count=1))
    if not insns:
        return None
    i = insns[0]
    mnem = i.mnemonic
    rep = mnem.startswith("rep ")
    if rep:
        mnem = mnem[4:]
    ops = i.operands
    mems = [o for o in ops if o.type == x86.X86_OP_MEM]
    regs = [o for o in ops if o.type == x86.X86_OP_REG]
    imms = [o for o in ops if o.type == x86.X86_OP_IMM]
    v = {"len": i.size, "mnemonic": mnem, "rep": rep, "reg": None,
         "mem_width": None, "base": None, "index": None, "scale": 1, "disp": 0,
         "imm": None, "seg": None, "nmem": len(mems)}
    if mnem in ("movsb", "movsw", "movsd", "movsq") and len(mems) == 2:
        v["kind"] = MOVS
    elif mnem.startswith("stos"):
        v["kind"] = STOS
    elif mnem == "movzx":
        v["kind"] = MOVZX
    elif mnem in ("movsx", "movsxd"):
        v["kind"] = MOVSX
    elif mnem == "mov" and mems and ops[0].type == x86.X86_OP_MEM:
        v["kind"] = STORE_IMM if imms else STORE
    elif mnem == "mov" and mems:
        v["kind"] = LOAD
    else:
        v["kind"] = None
    if regs:
        v["reg"] = i.reg_name(regs[0].reg)
        v["reg_width"] = regs[0].size
    if imms:
        v["imm"] = imms[0].imm
    if mems:
        m = mems[0]
        v["mem_width"] = m.size
        if v["kind"] not in (MOVS, STOS):
            v["base"] = i.reg_name(m.mem.base) if m.mem.base else None
            idx = i.reg_name(m.mem.index) if m.mem.index else None
            v["index"] = None if idx == "riz" else idx
            v["scale"] = m.mem.scale
            v["disp"] = m.mem.disp
            v["seg"] = i.reg_name(m.mem.segment) if m.mem.segment else None
    return v


def ours_view(d: dict) -> dict:
    """ng_decode()'s result in cs_view() terms."""
    kind = d["kind"]
    v = {"len": d["len"], "kind": kind, "rep": bool(d["rep"]),
         "mem_width": d["mem_width"], "reg": None, "imm": None}
    if kind in (LOAD, STORE, MOVZX, MOVSX, STOS):
        v["reg"] = reg_name(d["reg"], d["reg_width"], bool(d["high8"]))
        v["reg_width"] = d["reg_width"]
    if kind == STORE_IMM:
        v["imm"] = d["imm"]
    if kind not in (MOVS, STOS):
        b = d["base"]
        v["base"] = None if b == REG_NONE else ("rip" if b == REG_RIP else R64[b])
        v["index"] = None if d["index"] == REG_NONE else R64[d["index"]]
        v["scale"] = d["scale"]
        v["disp"] = d["disp"]
        v["seg"] = SEG_NAMES.get(d["seg"])
    return v


def compare_cs(cs: dict | None, ours: dict, what: str) -> list[str]:
    if cs is None:
        return [f"{what}: capstone does not decode it"]
    errs = []
    for k, v in ours.items():
        c = cs.get(k)
        if k == "imm" and v is not None and c is not None:
            c &= mask(ours["mem_width"])
        if c != v:
            errs.append(f"{what}: {k}: ours {v!r} capstone {c!r} ({cs['mnemonic']})")
    return errs


def spec_view(s: Spec) -> dict:
    """What the generator encoded, in ng_decode() terms."""
    return {"len": len(s.code), "kind": s.kind, "opcode": s.opcode,
            "mem_width": s.mem_width, "reg_width": s.reg_width, "reg": s.reg,
            "high8": int(s.high8), "rep": int(s.rep), "seg": s.seg,
            "base": s.base, "index": s.index, "scale": s.scale, "disp": s.disp,
            "imm": s.imm}


def test_decode_corpus_against_capstone(harness, md):
    rng = random.Random(99)
    # trailing bytes: the decoder must stop at the instruction's end
    codes = [s.code + bytes(rng.getrandbits(8) for _ in range(rng.randrange(4)))
             for s in CORPUS]
    results = decode_all(harness, codes)
    errs = []
    for s, d in zip(CORPUS, results, strict=True):
        if d["rc"] != 0:
            errs.append(f"{s}: rejected rc={d['rc']}")
            continue
        want = spec_view(s)
        for k, v in want.items():
            if d[k] != v:
                errs.append(f"{s}: {k}: decoded {d[k]:#x} generator {v:#x}")
        errs += compare_cs(cs_view(md, s.code), ours_view(d), str(s))
    assert not errs, f"{len(errs)} mismatches:\n" + "\n".join(errs[:40])


def test_decode_truncated_never_overreads(harness):
    """Every avail shorter than the instruction: -EINVAL, no read past it."""
    out = harness.run([f"T {s.code.hex()}" for s in CORPUS])
    errs = []
    for s, line in zip(CORPUS, out, strict=True):
        assert line != "SEGV", f"{s}: read beyond avail"
        got = line.split()
        n = len(s.code)
        want = [f"-{EINVAL}/0"] * n + [f"0/{n}"]
        if got != want:
            errs.append(f"{s}: {line}")
    assert not errs, "\n".join(errs[:20])


def reject_cases() -> list[tuple[bytes, str]]:
    rng = random.Random(5)
    cases = []
    modrm_ops = [b"\x88", b"\x89", b"\x8a", b"\x8b", b"\x0f\xb6", b"\x0f\xb7",
                 b"\x0f\xbe", b"\x0f\xbf", b"\x48\x63", b"\x48\x8b", b"\x66\x89"]
    for op in modrm_ops:
        for modrm in range(0xC0, 0x100):
            cases.append((op + bytes([modrm]) + b"\0" * 4, "mod=11"))
    for modrm in range(0xC0, 0xC8):
        cases.append((b"\xc6" + bytes([modrm, 0x12]), "mod=11 imm"))
        cases.append((b"\xc7" + bytes([modrm]) + b"\x12\x34\x56\x78", "mod=11 imm"))
        cases.append((b"\x48\xc7" + bytes([modrm]) + b"\x12\x34\x56\x78", "mod=11 imm"))
    for opc in (0xC6, 0xC7):
        for reg in range(1, 8):
            for mod in range(3):
                cases.append((bytes([opc, mod << 6 | reg << 3]) + b"\0" * 8,
                              "C6/C7 with reg != 0"))
    sample = rng.sample(CORPUS, 300)
    for s in sample:
        bad = rng.choice([0x67, 0xF0, 0xF2, 0x64, 0x65])
        pos = rng.randrange(cpu_prefixes(s.code)[1] + 1)
        code = s.code[:pos] + bytes([bad]) + s.code[pos:]
        if len(code) <= 15:
            cases.append((code, f"prefix {bad:02x}"))
    for s in rng.sample(MODRM_CORPUS, 100):
        cases.append((b"\xf3" + s.code, "F3 on a non-string instruction"))
    for code in ("6300", "406300", "446300", "666300", "63042500000000", "4763ff"):
        cases.append((bytes.fromhex(code), "movsxd without REX.W"))
    supported = {0x88, 0x89, 0x8A, 0x8B, 0xC6, 0xC7, 0x63, 0xA4, 0xA5, 0xAA, 0xAB, 0x0F}
    for opc in range(256):
        if opc not in supported and opc not in LEGACY and not 0x40 <= opc <= 0x4F:
            cases.append((bytes([opc]) + b"\x00" * 14, f"opcode {opc:02x}"))
            cases.append((b"\x48" + bytes([opc]) + b"\x04\x24" + b"\x00" * 11, f"opcode {opc:02x}"))
    for opc in range(256):
        if opc not in (0xB6, 0xB7, 0xBE, 0xBF):
            cases.append((b"\x0f" + bytes([opc]) + b"\x00" * 13, f"opcode 0f {opc:02x}"))
    long_ok = bytes.fromhex("2e3e2648c78424") + b"\0" * 8
    assert len(long_ok) == 15
    cases.append((b"\x2e" + long_ok, "16 bytes"))
    cases.append((b"\x66" * 14 + b"\x8b\x00", "16 bytes"))
    cases.append((b"\x2e" * 15 + b"\x8b\x00", "prefixes only within 15"))
    for code in ("", "66", "48", "2e48", "f3", "0f", "66" * 15, "40" * 15):
        cases.append((bytes.fromhex(code), "no opcode"))
    return cases


def test_decode_rejects(harness, md):
    cases = reject_cases()
    results = decode_all(harness, [c for c, _ in cases])
    errs = [f"{c.hex(' ')} ({why}): {d}" for (c, why), d in zip(cases, results, strict=True)
            if d["rc"] != -EINVAL]
    assert not errs, f"{len(errs)} accepted:\n" + "\n".join(errs[:40])
    # the 15-byte boundary itself is accepted
    long_ok = bytes.fromhex("2e3e2648c78424") + b"\0" * 8
    assert decode_all(harness, [long_ok])[0]["len"] == 15


def structured_fuzz(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    opcodes = [b"\x88", b"\x89", b"\x8a", b"\x8b", b"\xc6", b"\xc7", b"\x63",
               b"\xa4", b"\xa5", b"\xaa", b"\xab", b"\x0f\xb6", b"\x0f\xb7",
               b"\x0f\xbe", b"\x0f\xbf", b"\x0f\xb8", b"\x8d", b"\x0f\x10",
               b"\xa6", b"\x8c"]
    pfx = [0x66, 0x66, 0x2E, 0x3E, 0x26, 0x36, 0xF3, 0xF3, 0x67, 0xF0, 0xF2, 0x64, 0x65]
    out = []
    for _ in range(n):
        pre = bytearray()
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3, 5])):
            if rng.random() < 0.4:
                pre.append(0x40 | rng.randrange(16))
            else:
                pre.append(rng.choice(pfx))
        if rng.random() < 0.5:
            pre.append(0x40 | rng.randrange(16))
        tail = bytes(rng.getrandbits(8) for _ in range(14))
        out.append(bytes(pre) + rng.choice(opcodes) + tail)
    return out


def cpu_prefixes(code: bytes):
    """(legacy prefixes, opcode position) as the CPU sees them."""
    legacy, pos = set(), 0
    while pos < len(code) and (code[pos] in LEGACY or 0x40 <= code[pos] <= 0x4F):
        if code[pos] in LEGACY:
            legacy.add(code[pos])
        pos += 1
    return legacy, pos


def expect_accept(code: bytes, cs: dict | None) -> bool:
    """Should ng_decode() accept it (judged from capstone and the bytes)?"""
    if cs is None or cs["kind"] is None or cs["len"] > 15:
        return False
    legacy, pos = cpu_prefixes(code)
    if legacy & {0x67, 0xF0, 0xF2, 0x64, 0x65}:
        return False
    opc = code[pos]
    if opc == 0x0F:
        if code[pos + 1] not in (0xB6, 0xB7, 0xBE, 0xBF):
            return False
    elif opc not in (0x88, 0x89, 0x8A, 0x8B, 0xC6, 0xC7, 0x63, 0xA4, 0xA5, 0xAA, 0xAB):
        return False
    if 0xF3 in legacy and opc not in (0xA4, 0xA5, 0xAA, 0xAB):
        return False
    if cs["mnemonic"] == "movsxd" and cs.get("reg_width") != 8:
        return False
    return cs["nmem"] > 0


def test_decode_structured_fuzz(harness, md):
    """ng_decode() accepts exactly what it should, and then agrees with capstone."""
    codes = structured_fuzz(30000, 42)
    results = decode_all(harness, codes)
    errs = []
    accepted = 0
    for code, d in zip(codes, results, strict=True):
        cs = cs_view(md, code)
        want = expect_accept(code, cs)
        if want != (d["rc"] == 0):
            errs.append(f"{code.hex(' ')}: rc={d['rc']} expected accept={want} cs={cs}")
        elif want:
            accepted += 1
            errs += compare_cs(cs, ours_view(d), code.hex(" "))
    assert not errs, f"{len(errs)} mismatches:\n" + "\n".join(errs[:40])
    assert accepted > 3000


def test_decode_random_bytes_never_overread(harness, md):
    rng = random.Random(3)
    codes = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 17)))
             for _ in range(20000)]
    results = decode_all(harness, codes)
    for code, d in zip(codes, results, strict=True):
        if d["rc"] == 0:
            assert compare_cs(cs_view(md, code), ours_view(d), code.hex(" ")) == []
        else:
            assert d["rc"] == -EINVAL


# --------------------------------------------------------------------------
# Emulation against a Python model


def regs_str(regs: list[int]) -> str:
    return ",".join(f"{r:x}" for r in regs)


def random_regs(rng: random.Random) -> list[int]:
    regs = []
    for _ in range(18):
        c = rng.random()
        if c < 0.1:
            regs.append(rng.choice([0, M64, 0x80, 0xFF, 0x8000, 0x80000000]))
        elif c < 0.3:
            regs.append(rng.getrandbits(16))
        else:
            regs.append(rng.getrandbits(64))
    regs[FLAGS] = 0x202 | (DF if rng.random() < 0.5 else 0)
    return regs


def get_reg(regs, no, width, high8=False):
    if high8:
        return (regs[no - 4] >> 8) & 0xFF
    return regs[no] & mask(width)


def set_reg(regs, no, width, high8, val):
    if high8:
        regs[no - 4] = (regs[no - 4] & ~0xFF00 & M64) | (val & 0xFF) << 8
    elif width == 4:
        regs[no] = val & 0xFFFFFFFF
    elif width == 8:
        regs[no] = val & M64
    else:
        regs[no] = (regs[no] & ~mask(width) & M64) | (val & mask(width))


def effective_address(s: Spec, regs) -> int:
    ea = s.disp
    if s.base == REG_RIP:
        ea += regs[IP] + len(s.code)
    elif s.base != REG_NONE:
        ea += regs[s.base]
    if s.index != REG_NONE:
        ea += regs[s.index] * s.scale
    return ea & M64


class Memory(dict):
    """Sparse byte memory: address -> byte."""

    def read(self, addr, width):
        return sum(self[(addr + i) & M64] << (8 * i) for i in range(width))

    def write(self, addr, width, val):
        for i in range(width):
            self[(addr + i) & M64] = (val >> (8 * i)) & 0xFF


def model(s: Spec, regs: list[int], mem: Memory, failat=0, max_elems=0):
    """x86 semantics of the spec: (rc, regs, mem, accesses)."""
    regs = list(regs)
    mem = Memory(mem)
    acc = []
    calls = 0
    w = s.mem_width
    if s.kind in (MOVS, STOS):
        count = regs[RCX] if s.rep else 1
        step = -w if regs[FLAGS] & DF else w
        n = 0
        while n < count:
            if max_elems and n == max_elems:
                return 1, regs, mem, acc
            if s.kind == MOVS:
                calls += 1
                if calls == failat:
                    return -ENXIO, regs, mem, acc
                val = mem.read(regs[RSI], w)
                acc.append(("R", regs[RSI], w, val, n))
            else:
                val = regs[RAX] & mask(w)
            calls += 1
            if calls == failat:
                return -ENXIO, regs, mem, acc
            mem.write(regs[RDI], w, val)
            acc.append(("W", regs[RDI], w, val, n))
            if s.kind == MOVS:
                regs[RSI] = (regs[RSI] + step) & M64
            regs[RDI] = (regs[RDI] + step) & M64
            if s.rep:
                regs[RCX] -= 1
            n += 1
        regs[IP] = (regs[IP] + len(s.code)) & M64
        return 0, regs, mem, acc
    ea = effective_address(s, regs)
    if failat == 1:
        return -ENXIO, regs, mem, acc
    if s.kind in (STORE, STORE_IMM):
        val = s.imm & mask(w) if s.kind == STORE_IMM else get_reg(regs, s.reg, s.reg_width, s.high8)
        mem.write(ea, w, val)
        acc.append(("W", ea, w, val, 0))
    else:
        val = mem.read(ea, w)
        acc.append(("R", ea, w, val, 0))
        if s.kind == MOVSX:
            val = sext(val, w) & M64
        set_reg(regs, s.reg, s.reg_width, s.high8, val)
    regs[IP] = (regs[IP] + len(s.code)) & M64
    return 0, regs, mem, acc


def regions_of(mem: Memory) -> list[tuple[int, bytes]]:
    """Contiguous runs of the sparse memory (a run may wrap past 2^64)."""
    out = []
    for a in sorted(mem):
        if out and out[-1][0] + len(out[-1][1]) == a:
            out[-1] = (out[-1][0], out[-1][1] + bytes([mem[a]]))
        else:
            out.append((a, bytes([mem[a]])))
    if len(out) > 1 and out[0][0] == 0 and out[-1][0] + len(out[-1][1]) == 1 << 64:
        out = [(out[-1][0], out[-1][1] + out[0][1])] + out[1:-1]
    return out


def emu_line(s: Spec, regs, mem: Memory, fault: int, max_elems=0, failat=0) -> str:
    regions = ",".join(f"{a:x}:{b.hex()}" for a, b in regions_of(mem)) or "-"
    return f"E {s.code.hex()} {fault:x} {max_elems:x} {failat:x} {regs_str(regs)} {regions}"


def parse_emu(line: str):
    parts = line.split()
    assert parts[0] not in ("DECODE", "BADWIDTH", "BADARGS", "SEGV"), line
    rc = int(parts[0])
    regs = [int(x, 16) for x in parts[1].split(",")]
    mem = Memory()
    if parts[2] != "-":
        for reg in parts[2].split(","):
            a, h = reg.split(":")
            for i, byte in enumerate(bytes.fromhex(h)):
                mem[(int(a, 16) + i) & M64] = byte
    ops = [] if parts[3] == "-" else [x.split("@") for x in parts[3].rstrip(";").split(";")]
    ops = [(k, *(int(v, 16) for v in rest.split(":"))) for k, rest in ops]
    cbs = [] if parts[4] == "-" else [x.split("@") for x in parts[4].rstrip(";").split(";")]
    cbs = [(k.upper(), *(int(v, 16) for v in rest.split(":"))) for k, rest in cbs]
    return rc, regs, mem, ops, cbs


def fill(mem: Memory, rng, addr, n):
    for i in range(n):
        mem.setdefault((addr + i) & M64, rng.getrandbits(8))


def check_emulation(harness, cases):
    """cases: (spec, regs, mem, fault, max_elems, failat, expected-rc-or-None)."""
    out = harness.run([emu_line(s, r, m, f, mx, fa) for s, r, m, f, mx, fa, _ in cases])
    errs = []
    for (s, r, m, f, mx, fa, want_rc), line in zip(cases, out, strict=True):
        rc, regs, mem, ops, cbs = parse_emu(line)
        if want_rc is not None:     # not emulated at all
            exp = (want_rc, r, m, [])
        else:
            exp = model(s, r, m, failat=fa, max_elems=mx)
        exp_ops = [a[:4] for a in exp[3]]
        got = (rc, regs, mem, ops)
        if got != (exp[0], exp[1], exp[2], exp_ops) or cbs != exp[3]:
            diff = [REGS[i] for i in range(18) if regs[i] != exp[1][i]]
            errs.append(f"{s} regs={regs_str(r)} fault={f:x} max={mx} failat={fa}: "
                        f"rc {rc} want {exp[0]}; regs differ {diff}; "
                        f"mem {'ok' if mem == exp[2] else 'differs'}; "
                        f"ops {ops} want {exp_ops}; cb {cbs} want {exp[3]}")
    assert not errs, f"{len(errs)} mismatches:\n" + "\n".join(errs[:20])


def test_emulate_modrm_forms(harness):
    rng = random.Random(11)
    cases = []
    for s in MODRM_CORPUS:
        regs = random_regs(rng)
        ea = effective_address(s, regs)
        mem = Memory()
        fill(mem, rng, ea - 8, s.mem_width + 16)
        fault = (ea + rng.randrange(s.mem_width)) & M64
        cases.append((s, regs, mem, fault, 0, 0, None))
    check_emulation(harness, cases)


def test_emulate_modrm_fault_mismatch_and_errors(harness):
    rng = random.Random(12)
    cases = []
    for s in rng.sample(MODRM_CORPUS, 1500):
        regs = random_regs(rng)
        ea = effective_address(s, regs)
        mem = Memory()
        fill(mem, rng, ea - 8, s.mem_width + 16)
        bad = [b & M64 for b in (ea - 1, ea + s.mem_width, ea ^ (1 << 40), 0)
               if (b - ea) & M64 >= s.mem_width]
        cases.append((s, regs, mem, rng.choice(bad), 0, 0, -EFAULT))
        # the access fails: nothing changes
        cases.append((s, regs, mem, ea, 0, 1, None))
        # the memory is not there (ops->read/write return -EIO)
        cases.append((s, regs, Memory(), ea, 0, 0, -EIO))
    check_emulation(harness, cases)


def test_emulate_register_semantics(harness):
    """Pinned cases, independent of the generator."""
    regs = [0x1111111111111111 * (i % 15 + 1) & M64 for i in range(18)]
    regs[IP] = 0x1000
    regs[FLAGS] = 0x202
    regs[RAX] = 0x2000      # base for [rax]
    mem = Memory()
    mem.write(0x2000, 8, 0x8899AABBCCDDEEFF)
    fill(mem, random.Random(0), 0x2008, 8)

    def run(hexcode):
        s = Spec(code=bytes.fromhex(hexcode), form="pinned", kind=0, opcode=0, mem_width=1)
        rc, out, m, _, _ = parse_emu(harness.run([emu_line(s, regs, mem, 0x2000)])[0])
        assert rc == 0, hexcode
        return out, m

    out, _ = run("8b18")            # mov ebx, [rax]: upper half zeroed
    assert out[3] == 0xCCDDEEFF and out[IP] == 0x1002
    out, _ = run("8a38")            # mov bh, [rax]
    assert out[3] == (regs[3] & ~0xFF00) | 0xFF00
    out, _ = run("408a38")          # mov dil, [rax]
    assert out[RDI] == (regs[RDI] & ~0xFF) | 0xFF
    out, _ = run("668b18")          # mov bx, [rax]
    assert out[3] == (regs[3] & ~0xFFFF) | 0xEEFF
    out, _ = run("0fbe18")          # movsx ebx, byte [rax]
    assert out[3] == 0xFFFFFFFF
    out, _ = run("480fbf18")        # movsx rbx, word [rax]
    assert out[3] == 0xFFFFFFFFFFFFEEFF
    out, _ = run("66 0f be 18".replace(" ", ""))     # movsx bx, byte
    assert out[3] == (regs[3] & ~0xFFFF) | 0xFFFF
    out, _ = run("486318")          # movsxd rbx, [rax]
    assert out[3] == 0xFFFFFFFFCCDDEEFF
    out, _ = run("0fb718")          # movzx ebx, word [rax]
    assert out[3] == 0xEEFF
    out, m = run("48c700feffffff")  # mov qword [rax], -2
    assert m.read(0x2000, 8) == 0xFFFFFFFFFFFFFFFE
    out, m = run("8820")            # mov [rax], ah
    assert m.read(0x2000, 1) == 0x20
    out, m = run("408820")          # mov [rax], spl
    assert m.read(0x2000, 1) == regs[4] & 0xFF
    out, m = run("66c700fe80")      # mov word [rax], 0x80fe
    assert m.read(0x2000, 8) == 0x8899AABBCCDD80FE
    out, _ = run("8b05fa0f0000")    # mov eax, [rip+0xffa]: 0x1000 + 6 + 0xffa
    assert out[RAX] == 0xCCDDEEFF and out[IP] == 0x1006


def string_cases(rng, specs, reps=3):
    cases = []
    for s in specs:
        for _ in range(reps):
            regs = random_regs(rng)
            w = s.mem_width
            if s.rep:
                regs[RCX] = rng.choice([0, 1, 2, 3, 5, 8, rng.randrange(20)])
            count = regs[RCX] if s.rep else 1
            down = bool(regs[FLAGS] & DF)
            mem = Memory()
            if rng.random() < 0.2 and s.kind == MOVS:
                # overlapping source and destination
                regs[RDI] = (regs[RSI] + rng.choice([-2, -1, 1, 2, w]) * w) & M64
            for r in (RSI, RDI):
                lo = regs[r] - (count * w if down else 0) - 8
                fill(mem, rng, lo, count * w + w + 16)
            fault = regs[RSI] if s.kind == MOVS and rng.random() < 0.5 else regs[RDI]
            fault = (fault + rng.randrange(w)) & M64
            max_elems = rng.choice([0, 0, 0, 1, 2, 3]) if s.rep else 0
            failat = rng.choice([0] * 6 + [1, 2, 3, 4])
            cases.append((s, regs, mem, fault, max_elems, failat, None))
    return cases


def test_emulate_string_forms(harness):
    rng = random.Random(13)
    check_emulation(harness, string_cases(rng, STRING_CORPUS, reps=6))


def test_emulate_rep_pinned(harness):
    s = Spec(code=b"\xf3\x48\xa5", form="rep movsq", kind=MOVS, opcode=0xA5, mem_width=8,
             rep=True)
    regs = [0] * 18
    regs[RSI], regs[RDI], regs[RCX], regs[IP], regs[FLAGS] = 0x1000, 0x2000, 3, 0x500, 0x202
    mem = Memory()
    for i in range(4):
        mem.write(0x1000 + 8 * i, 8, 0x1111111111111111 * (i + 1))
        mem.write(0x2000 + 8 * i, 8, 0)
    rc, out, m, ops, cbs = parse_emu(harness.run([emu_line(s, regs, mem, 0x2000)])[0])
    assert rc == 0
    assert (out[RSI], out[RDI], out[RCX], out[IP]) == (0x1018, 0x2018, 0, 0x503)
    assert [m.read(0x2000 + 8 * i, 8) for i in range(4)] == \
        [0x1111111111111111, 0x2222222222222222, 0x3333333333333333, 0]
    assert [c[0] for c in cbs] == ["R", "W"] * 3 and [c[4] for c in cbs] == [0, 0, 1, 1, 2, 2]
    # DF=1: backwards
    regs[FLAGS] |= DF
    regs[RSI], regs[RDI] = 0x1018, 0x2018
    rc, out, m, _, _ = parse_emu(harness.run([emu_line(s, regs, mem, 0x1018)])[0])
    assert rc == 0 and (out[RSI], out[RDI], out[RCX]) == (0x1000, 0x2000, 0)
    assert [m.read(0x2000 + 8 * i, 8) for i in range(4)] == \
        [0, 0x2222222222222222, 0x3333333333333333, 0x4444444444444444]
    # rcx == 0: nothing but ip
    regs[RCX] = 0
    rc, out, m, ops, _ = parse_emu(harness.run([emu_line(s, regs, mem, 0x1234)])[0])
    assert rc == 0 and ops == [] and out[IP] == 0x503 and m == mem
    # partial: 2 of 3, ip stays, and a second call finishes
    regs[FLAGS] &= ~DF
    regs[RSI], regs[RDI], regs[RCX] = 0x1000, 0x2000, 3
    rc, out, m, ops, _ = parse_emu(harness.run([emu_line(s, regs, mem, 0x2000, 2)])[0])
    assert rc == 1 and out[RCX] == 1 and out[IP] == 0x500 and len(ops) == 4
    rc, out, m, ops, _ = parse_emu(harness.run([emu_line(s, out, m, out[RDI], 2)])[0])
    assert rc == 0 and out[RCX] == 0 and out[IP] == 0x503 and len(ops) == 2
    # stos with rep writes rax per element, exact width
    st = Spec(code=b"\xf3\xaa", form="rep stosb", kind=STOS, opcode=0xAA, mem_width=1,
              reg_width=1, reg=0, rep=True)
    regs[RAX], regs[RCX] = 0x1234567890ABCDEF, 4
    rc, out, m, ops, _ = parse_emu(harness.run([emu_line(st, regs, mem, 0x2000)])[0])
    assert rc == 0 and [o[2] for o in ops] == [1] * 4 and m.read(0x2000, 4) == 0xEFEFEFEF
    # the fault address must be one of the operands
    rc, *_ = parse_emu(harness.run([emu_line(s, regs, mem, 0x3000)])[0])
    assert rc == -EFAULT


# --------------------------------------------------------------------------
# Compatibility with the kernel's mmiotrace (pf_in.c as the oracle)


def compat_compare(oracle, items: list[tuple[bytes, list[int]]], what: str):
    lines = []
    for code, regs in items:
        lines += [f"C {code.hex() or '-'} {regs_str(regs)}",
                  f"K {code.hex() or '-'} {regs_str(regs)}"]
    out = oracle.run(lines)
    errs = []
    for (code, regs), c, k in zip(items, out[0::2], out[1::2], strict=True):
        crc, *cvals = c.split()
        assert k not in ("SEGV", "NOORACLE", "BADREGS"), k
        if k == "FAULT":
            if int(crc) != -EINVAL:
                errs.append(f"{code.hex(' ')}: kernel reads beyond the bytes, ng_compat {c}")
            continue
        kop, kwidth, kvalue, _printks = k.split()
        if int(crc) != 0 or cvals != [kop, kwidth, kvalue]:
            errs.append(f"{code.hex(' ')} regs={regs_str(regs)}: ng_compat {c} kernel {k}")
    assert not errs, f"{what}: {len(errs)} mismatches:\n" + "\n".join(errs[:30])


def test_compat_corpus(oracle):
    rng = random.Random(21)
    items = []
    for s in CORPUS:
        trailer = bytes(rng.getrandbits(8) for _ in range(8))
        items.append((s.code + trailer, random_regs(rng)))
        items.append((s.code + trailer, random_regs(rng)))
    compat_compare(oracle, items, "corpus")


def test_compat_fuzz_and_rejects(oracle):
    rng = random.Random(22)
    codes = structured_fuzz(20000, 43) + [c for c, _ in reject_cases()]
    codes += [bytes(rng.getrandbits(8) for _ in range(rng.randrange(3, 24))) for _ in range(10000)]
    # register-heavy: every opcode the kernel knows, after every prefix mix
    kops = [b"\x88", b"\x89", b"\x8a", b"\x8b", b"\xaa", b"\xab", b"\xc6", b"\xc7",
            b"\x0f\xb6", b"\x0f\xb7", b"\x0f\xbe", b"\x0f\xbf"]
    for _ in range(20000):
        pre = bytes(rng.choice([0x66, 0x40 | rng.randrange(16), 0xF3, 0x2E, 0x67])
                    for _ in range(rng.randrange(4)))
        codes.append(pre + rng.choice(kops) + bytes(rng.getrandbits(8) for _ in range(16)))
    compat_compare(oracle, [(c, random_regs(rng)) for c in codes], "fuzz")


def test_compat_reads_exactly_what_the_kernel_reads(oracle):
    """ng_compat() needs the same bytes as pf_in.c: one byte fewer and the
    kernel's code faults on the guard page, while ng_compat() says -EINVAL."""
    rng = random.Random(23)
    codes = [s.code + bytes(rng.getrandbits(8) for _ in range(8)) for s in CORPUS]
    codes += [c + bytes(8) for c in structured_fuzz(3000, 44)]
    out = oracle.run([f"N {c.hex()}" for c in codes])
    regs = regs_str([0x5A5A5A5A5A5A5A5A] * 18)   # as the N command uses
    lines, needs = [], []
    for code, line in zip(codes, out, strict=True):
        assert not line.startswith("MISMATCH"), f"{code.hex(' ')}: {line}"
        need = int(line)
        assert need > 0, f"{code.hex(' ')}: ng_compat never succeeds"
        needs.append(need)
        lines += [f"K {code[:need].hex()} {regs}", f"C {code[:need].hex()} {regs}",
                  f"K {code[:need - 1].hex() or '-'} {regs}"]
    out = oracle.run(lines)
    for code, need, k, c, kshort in zip(codes, needs, out[0::3], out[1::3], out[2::3], strict=True):
        assert k != "FAULT", f"{code.hex(' ')}: kernel needs more than {need} bytes"
        assert c.split()[1:] == k.split()[:3], f"{code.hex(' ')}: {c} vs {k}"
        assert kshort == "FAULT", f"{code.hex(' ')}: kernel needs fewer than {need} bytes"
    assert max(needs[:len(CORPUS)]) <= 19     # NG_COMPAT_MAX_BYTES


QUIRKS = [
    # bytes, registers {name: value}, expected (op, width, value)
    ("6648890000000000", {"rax": 0x1122334455667788}, (OP_WRITE, 2, 0x7788)),     # 66 wins over W
    ("48c700ffffffffaabbccdd", {}, (OP_WRITE, 4, 0xDDCCBBAAFFFFFFFF)),            # 8 imm bytes
    ("c7042478563412ee", {}, (OP_WRITE, 4, 0x34567824)),                          # SIB not skipped
    ("48c7442408f0debc9a123456", {}, (OP_WRITE, 4, 0x5634129ABCDEF008)),          # SIB as disp8
    ("66c7002211", {}, (OP_WRITE, 2, 0x1122)),
    ("c600ab", {}, (OP_WRITE, 1, 0xAB)),
    ("a5", {}, (OP_UNKNOWN, 0, 0xA5ABCD)),                                         # movs unknown
    ("f348a5", {}, (OP_UNKNOWN, 0, 0xF348A5)),
    ("486300", {}, (OP_UNKNOWN, 0, 0x486300)),                                     # movsxd unknown
    # a REX before a legacy prefix still counts for the kernel: REX.W, REX.R (r12b)
    ("48408b00", {"rax": 0x1122334455667788}, (OP_READ, 8, 0x1122334455667788)),
    ("44668820", {"r12": 0x1234, "rax": 0xAA00}, (OP_WRITE, 1, 0x34)),
    ("8820", {"rax": 0xAA55}, (OP_WRITE, 1, 0xAA)),                               # ah
    ("408820", {"rsp": 0x77, "rax": 0xAA55}, (OP_WRITE, 1, 0x77)),                # spl
    ("aa", {"rax": 0x1234}, (OP_WRITE, 1, 0x34)),
    ("48ab", {"rax": 0x1122334455667788}, (OP_WRITE, 8, 0x1122334455667788)),
    ("f366ab", {"rax": 0x1122334455667788}, (OP_WRITE, 2, 0x7788)),
    ("0fb600", {"rax": 0xFFFFFFFF000000AB}, (OP_READ, 1, 0xAB)),                   # reg width 4
    ("480fbf00", {"rax": 0xFFFFFFFFFFFF8000}, (OP_READ, 2, 0xFFFFFFFFFFFF8000)),
    ("8a20", {"rax": 0xAB00}, (OP_READ, 1, 0xAB)),
    ("678b00", {"rax": 0x1122334455667788}, (OP_READ, 4, 0x55667788)),            # 67 skipped
    ("648b00", {"rax": 0x1122334455667788}, (OP_READ, 4, 0x55667788)),
]


@pytest.mark.parametrize("code,regvals,expected", QUIRKS, ids=[q[0] for q in QUIRKS])
def test_compat_quirks(oracle, code, regvals, expected):
    regs = [0] * 18
    for name, v in regvals.items():
        regs[REGS.index(name)] = v
    code = bytes.fromhex(code) + b"\xab\xcd\xef\x01\x02\x03\x04\x05"
    out = oracle.run([f"C {code.hex()} {regs_str(regs)}", f"K {code.hex()} {regs_str(regs)}"])
    c = [int(x, 16) if i == 3 else int(x) for i, x in enumerate(out[0].split())]
    k = out[1].split()
    kernel = (int(k[0]), int(k[1]), int(k[2], 16))
    assert kernel == expected, f"oracle {out[1]}"
    assert c == [0, *expected], f"ng_compat {out[0]}"


def test_compat_without_regs(harness):
    """regs NULL: op and width still reported, register values as 0."""
    out = harness.run(["C 8b00 -", "C c70011223344 -", "C a5a5a5 -"])
    assert out == [f"0 {OP_READ} 4 0", f"0 {OP_WRITE} 4 44332211",
                   f"0 {OP_UNKNOWN} 0 a5a5a5"]


def test_compat_after_emulation(oracle):
    """End to end: emulate a read, then ng_compat() with the registers after it."""
    rng = random.Random(24)
    specs = [s for s in MODRM_CORPUS if s.kind in (LOAD, MOVZX, MOVSX)][:2000]
    cases = []
    for s in specs:
        regs = random_regs(rng)
        ea = effective_address(s, regs)
        mem = Memory()
        fill(mem, rng, ea, s.mem_width)
        cases.append((s, regs, mem, ea))
    out = oracle.run([emu_line(s, r, m, f) for s, r, m, f in cases])
    items = []
    for (s, _, _, _), line in zip(cases, out, strict=True):
        rc, after, *_ = parse_emu(line)
        assert rc == 0
        items.append((s.code + bytes(8), after))
    compat_compare(oracle, items, "after emulation")


# --------------------------------------------------------------------------
# Kernel build and style


def test_kernel_build_no_warnings(tmp_path):
    kbuild = next((d for d in KBUILD_DIRS if (d / "Makefile").exists()), None)
    if kbuild is None or shutil.which("make") is None:
        missing("no kernel headers (linux-headers-6.1.0-57-amd64) or make")
    for f in ("ng_decode.c", "ng_decode.h"):
        shutil.copy(KMOD / f, tmp_path / f)
    (tmp_path / "ngmain.c").write_text(
        '// SPDX-License-Identifier: GPL-2.0\n#include <linux/module.h>\n'
        '#include "ng_decode.h"\nMODULE_LICENSE("GPL");\n'
        'MODULE_DESCRIPTION("ng_decode build test");\n')
    (tmp_path / "Kbuild").write_text("obj-m := ngdecode_test.o\n"
                                     "ngdecode_test-y := ng_decode.o ngmain.o\n")
    proc = subprocess.run(["make", "-C", str(kbuild), f"M={tmp_path}", "W=1", "modules"],
                          check=False, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert (tmp_path / "ngdecode_test.ko").exists(), log
    bad = [ln for ln in log.splitlines() if "warning:" in ln.lower() or "error:" in ln.lower()]
    assert not bad, log
