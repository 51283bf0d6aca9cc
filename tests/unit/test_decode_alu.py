"""Host tests for ng_decode_alu() and the emulation of the ALU ops on memory
(kmod/ng_decode.c: the instructions a process's accesses to a traced BAR
may use beyond the moves, which the kernel's tracer never sees).

The truth is this machine's CPU: each instruction of a generated corpus
(every opcode form, width, memory-operand form, lock where it is allowed,
random registers, flags and memory) is run by the harness on the CPU
itself (command X: the instruction and a ret, called with the registers
loaded) and emulated by ng_emulate() (LE) from the same state; the
registers, the arithmetic flags and the memory must be the same, and the
emulator's accesses a read of the operand then a write of the result (none
for cmp and test); a failed access leaves everything as it was.  capstone
gives each instruction's length and operand width, and ng_decode() (the
kernel path's decoder) must still refuse every one of them.  Locked
instructions (lock, xchg) are refused: a read then a write is not atomic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from capstone import x86
from test_decode import harness, md  # noqa: F401  (fixtures)

CODE, DATA = 0x5A0000000, 0x5A0000800      # the harness's CPU page (command B)
ARITH = 0x8D5
CF, AF = 0x001, 0x010
RSP = 4
NREGS = 18
IP, FLAGS = 16, 17
ALU_MEM, ALU_REG = 8, 9
# enum ng_alu
ADD, OR, ADC, SBB, AND, SUB, XOR, CMP, TEST, NOT, NEG, INC, DEC = range(13)
SEGMENTS = (0x26, 0x2E, 0x36, 0x3E)
LOGIC = {OR, AND, XOR, TEST}


@dataclass(frozen=True)
class Form:
    """One opcode form: the opcode, the ModRM reg field if it is an
    extension (else a register), the immediate's size for 16/32/64-bit
    operands, whether it has a byte operand, what it does."""
    opcode: int
    ext: int | None
    imm: int            # 0, 1, or 4 (2 with 66)
    byte: bool
    kind: int
    alu: int


def forms() -> list[Form]:
    out = []
    for op in range(8):
        for low in range(4):
            out.append(Form(op * 8 + low, None, 0, not low & 1, ALU_REG if low & 2 else ALU_MEM,
                            op))
        out.append(Form(0x80, op, 1, True, ALU_MEM, op))
        out.append(Form(0x81, op, 4, False, ALU_MEM, op))
        out.append(Form(0x83, op, 1, False, ALU_MEM, op))
    for opcode in (0x84, 0x85):
        out.append(Form(opcode, None, 0, opcode == 0x84, ALU_MEM, TEST))
    for opcode in (0xF6, 0xF7):
        out.append(Form(opcode, 0, 1 if opcode == 0xF6 else 4, opcode == 0xF6, ALU_MEM, TEST))
        out.append(Form(opcode, 2, 0, opcode == 0xF6, ALU_MEM, NOT))
        out.append(Form(opcode, 3, 0, opcode == 0xF6, ALU_MEM, NEG))
    for opcode in (0xFE, 0xFF):
        out.append(Form(opcode, 0, 0, opcode == 0xFE, ALU_MEM, INC))
        out.append(Form(opcode, 1, 0, opcode == 0xFE, ALU_MEM, DEC))
    return out


@dataclass
class Case:
    code: bytes
    regs: list[int]
    target: int
    width: int
    form: Form
    operand: int        # the memory operand's value (8 bytes at target)


EDGES = [0, 1, 2, 0x0F, 0x10, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000,
         0xFFFFFFFF, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def value(rng: random.Random) -> int:
    """A 64-bit value, often one where the flags change (carries, signs)."""
    if rng.random() < 0.5:
        return (rng.choice(EDGES) + rng.choice([0, 0, -1, 1])) % (1 << 64)
    return rng.getrandbits(64)


def le(v: int, n: int) -> bytes:
    return (v & ((1 << (8 * n)) - 1)).to_bytes(n, "little")


def make_case(rng: random.Random, form: Form, width: int) -> Case:
    regs = [value(rng) for _ in range(16)] + [CODE, rng.getrandbits(12) & ARITH]
    target = DATA + rng.randrange(0, 48)
    prefix = bytes([rng.choice(SEGMENTS)]) if rng.random() < 0.2 else b""
    if width == 2:
        prefix += b"\x66"
        if rng.random() < 0.2:      # the order of legacy prefixes does not matter
            prefix = prefix[::-1]
    rex = 0x08 if width == 8 else 0
    # the register operand: any but rsp (4 is AH in a byte form without REX)
    want_rex = rng.random() < 0.3
    reg = form.ext if form.ext is not None else rng.choice(
        [r for r in range(16) if r != RSP or (form.byte and not want_rex and width != 8)])
    if form.ext is None and reg >= 8:
        rex |= 0x04
    mode = rng.choice(["rip", "base", "base8", "base32", "sib", "sib8", "nobase"])
    regs_free = [r for r in range(16) if r != RSP and (form.ext is not None or r != reg)]
    base, index = rng.sample(regs_free, 2)
    scale_bits = rng.randrange(4)
    scale = 1 << scale_bits
    disp = b""
    if mode == "rip":
        modrm_rm, mod, sib = 5, 0, b""
    elif mode.startswith("base"):
        if base & 7 == 4:               # r12 needs a SIB byte: plain base is enough here
            base = 3
        mod = {"base": 0, "base8": 1, "base32": 2}[mode]
        if mod == 0 and base & 7 == 5:  # rbp/r13 without disp is rip-relative: add one
            mod = 1
        modrm_rm, sib = base & 7, b""
        rex |= 0x01 if base >= 8 else 0
    else:
        mod = {"sib": 0, "sib8": 1, "nobase": 0}[mode]
        if mode == "sib" and base & 7 == 5:
            mod = 1
        sib_base = 5 if mode == "nobase" else base & 7
        modrm_rm, sib = 4, bytes([scale_bits << 6 | (index & 7) << 3 | sib_base])
        rex |= (0x02 if index >= 8 else 0) | (0x01 if base >= 8 and mode != "nobase" else 0)
    if form.ext is None and reg == RSP and (rex or want_rex):
        return make_case(rng, form, width)      # spl: not rsp, not here
    if rex or want_rex:     # (reg 4..7 of a byte form: ah..bh without, spl..dil with)
        prefix += bytes([0x40 | rex])
    modrm = bytes([mod << 6 | (reg & 7) << 3 | modrm_rm])
    opcode = bytes([form.opcode])
    imm_size = form.imm if form.imm != 4 or width != 2 else 2
    if form.byte:
        imm_size = min(imm_size, 1)
    imm = le(value(rng), imm_size)
    disp_size = 4 if mode in ("rip", "nobase") or mod == 2 else (1 if mod == 1 else 0)
    length = len(prefix) + 1 + 1 + len(sib) + disp_size + imm_size
    # registers and displacement that put the operand at target
    if mode == "rip":
        d = target - (CODE + length)
    elif mode == "nobase":
        regs[index] = rng.randrange(0, 64)
        d = target - regs[index] * scale
        while not -(1 << 31) <= d < (1 << 31):
            regs[index] = (target - rng.randrange(-(1 << 20), 1 << 20)) // scale
            d = target - regs[index] * scale
    else:
        d = rng.randrange(-128, 128) if disp_size == 1 else (
            rng.randrange(-(1 << 31), 1 << 31) if disp_size == 4 else 0)
        idx = 0
        if sib:
            regs[index] = rng.randrange(0, 64)
            idx = regs[index] * scale
        regs[base] = (target - d - idx) & ((1 << 64) - 1)
    disp = le(d, disp_size)
    code = prefix + opcode + modrm + sib + disp + imm
    assert len(code) == length
    return Case(code, regs, target, 1 if form.byte else width, form, value(rng))


def corpus() -> list[Case]:
    rng = random.Random(0x411)
    cases = []
    for form in forms():
        widths = [1] if form.byte else [2, 4, 8]
        for width in widths:
            for _ in range(32):
                cases.append(make_case(rng, form, width))
    return cases


def regs_str(regs: list[int]) -> str:
    return ",".join(f"{v & ((1 << 64) - 1):x}" for v in regs)


def memory(rng: random.Random, c: Case) -> str:
    data = bytearray(rng.getrandbits(8) for _ in range(64))
    off = c.target - DATA
    data[off:off + 8] = le(c.operand, 8)
    return f"{DATA:x}:" + data.hex()


def test_corpus_covers_every_form():
    cases = corpus()
    assert {(c.form, c.width) for c in cases} == {
        (f, w) for f in forms() for w in ([1] if f.byte else [2, 4, 8])}
    assert len(cases) > 3000
    # AH as the register operand, segment prefixes, 66 before and after one
    assert any(c.code[-len(c.code):][0] in SEGMENTS for c in cases)
    assert any(c.form.byte and c.form.ext is None and c.code.find(bytes([c.form.opcode])) >= 0
               and not any(0x40 <= b < 0x50 for b in c.code[:c.code.find(bytes([c.form.opcode]))])
               and (c.code[c.code.find(bytes([c.form.opcode])) + 1] >> 3) & 7 == RSP
               for c in cases)


def test_alu_ops_emulated_as_the_cpu_runs_them(harness):  # noqa: F811
    rng = random.Random(7)
    cases = corpus()
    mems = [memory(rng, c) for c in cases]
    lines = []
    for c, mem in zip(cases, mems, strict=True):
        r = regs_str(c.regs)
        lines.append(f"X {c.code.hex()} {r} {mem}")
        lines.append(f"LE {c.code.hex()} {c.target:x} 0 0 {r} {mem}")
    out = harness.run(lines)
    bad = []
    for i, c in enumerate(cases):
        cpu, emu = out[2 * i].split(), out[2 * i + 1].split()
        what = f"{c.code.hex()} ({c.form.alu=}, width {c.width})"
        if emu[0] != "0" or len(cpu) != 2:
            bad.append(f"{what}: cpu {out[2 * i]} emu {out[2 * i + 1]}")
            continue
        cpu_regs = [int(x, 16) for x in cpu[0].split(",")]
        emu_regs = [int(x, 16) for x in emu[1].split(",")]
        flags_mask = ARITH   # AF: undefined there
        cpu_regs[IP] += len(c.code)
        cpu_regs[FLAGS] &= flags_mask
        emu_regs[FLAGS] &= flags_mask
        if cpu_regs != emu_regs:
            pairs = enumerate(zip(cpu_regs, emu_regs, strict=True))
            diff = [(n, hex(a), hex(b)) for n, (a, b) in pairs if a != b]
            bad.append(f"{what}: registers (no, cpu, emu): {diff}")
        if cpu[1] != emu[2]:
            bad.append(f"{what}: memory cpu {cpu[1]} emu {emu[2]}")
        writes = c.form.alu not in (CMP, TEST) and c.form.kind == ALU_MEM
        ops = [op[0] + op[1:].split(":")[1] for op in emu[3].split(";") if op]
        want = [f"R{c.width}"] + ([f"W{c.width}"] if writes else [])
        if ops != want or not emu[3].startswith(f"R@{c.target:x}:"):
            bad.append(f"{what}: accesses {emu[3]}, want {want} at {c.target:x}")
    assert not bad, f"{len(bad)} of {len(cases)}:\n" + "\n".join(bad[:20])


def test_alu_decoding_agrees_with_capstone_and_the_kernel_path_refuses_it(harness, md):  # noqa: F811
    cases = corpus()
    out = harness.run([f"LD {c.code.hex()}" for c in cases] + [f"D {c.code.hex()}" for c in cases])
    bad = []
    for c, ours, plain in zip(cases, out[:len(cases)], out[len(cases):], strict=True):
        fields = ours.split()
        insn = next(md.disasm(c.code, CODE), None)
        if fields[0] != "0":
            bad.append(f"{c.code.hex()}: ng_decode_alu {ours}")
            continue
        if insn is None or insn.size != len(c.code) or int(fields[1]) != len(c.code):
            bad.append(f"{c.code.hex()}: length ours {fields[1]} capstone "
                       f"{insn and insn.size} generated {len(c.code)}")
        mem = [op.size for op in (insn.operands if insn else []) if op.type == x86.X86_OP_MEM]
        if mem != [c.width] or int(fields[4]) != c.width or int(fields[2]) != c.form.kind:
            bad.append(f"{c.code.hex()}: width ours {fields[4]} kind {fields[2]}, capstone "
                       f"{mem} ({insn and insn.mnemonic}), generated {c.width}")
        if plain != "-22":
            bad.append(f"{c.code.hex()}: ng_decode() took it: {plain}")
    assert not bad, "\n".join(bad[:20])


def test_a_failed_access_leaves_everything_as_it_was(harness):  # noqa: F811
    """The read refused (failat 1), or the write (failat 2): the error, and
    the registers, flags and memory untouched."""
    rng = random.Random(11)
    cases = [c for c in corpus()[::5] if c.form.kind == ALU_MEM and c.form.alu not in (CMP, TEST)]
    lines = []
    for c in cases:
        mem = memory(rng, c)
        for failat in (1, 2):
            lines.append(f"LE {c.code.hex()} {c.target:x} 0 {failat} {regs_str(c.regs)} {mem}")
    out = harness.run(lines)
    for i, c in enumerate(cases):
        for k in range(2):
            res = out[2 * i + k].split()
            assert res[0] == "-6", (c.code.hex(), out[2 * i + k])
            assert [int(x, 16) for x in res[1].split(",")] == c.regs, (c.code.hex(), res)
            assert res[2] == lines[2 * i + k].split()[-1], (c.code.hex(), res)
    assert len(cases) > 300


@pytest.mark.parametrize("code, why", [
    ("f0830800", "lock or: not atomic as emulated"),
    ("f00100", "lock add r/m, r"),
    ("f0ff00", "lock inc"),
    ("8700", "xchg: locked always"),
    ("8600", "xchg r/m8"),
    ("f03b00", "lock cmp r, r/m (#UD)"),
    ("f03900", "lock cmp r/m, r"),
    ("f0833800", "lock cmp r/m, imm"),
    ("f08500", "lock test"),
    ("f0f60001", "lock test imm"),
    ("f00300", "lock add r, r/m: register destination"),
    ("f60801", "F6 /1: undocumented test"),
    ("f620", "F6 /4: mul"),
    ("f738", "F7 /7: idiv"),
    ("fe10", "FE /2: not an inc or dec"),
    ("ff10", "FF /2: call"),
    ("ff30", "FF /6: push"),
    ("820001", "82: invalid in 64-bit mode"),
    ("01c0", "mod 11: no memory operand"),
    ("f30100", "F3 on add"),
    ("f20100", "F2"),
    ("670100", "67: address size"),
    ("640100", "FS"),
    ("0500000000", "add eax, imm: no memory operand"),
    ("f08b00", "lock mov"),
    ("f0a5", "lock movs"),
    ("0fb100", "cmpxchg: not known"),
    ("81", "truncated before ModRM"),
    ("810001", "truncated immediate"),
])
def test_alu_decoder_refuses(harness, code, why):  # noqa: F811
    assert harness.run([f"LD {code}"]) == ["-22"], why


def test_alu_decoder_never_reads_past_the_bytes(harness):  # noqa: F811
    """LT: every avail from 0 to the length; the bytes end at an
    inaccessible page, so an over-read is a SEGV."""
    cases = corpus()[::7]
    out = harness.run([f"LT {c.code.hex()}" for c in cases])
    for c, line in zip(cases, out, strict=True):
        res = line.split()
        assert "SEGV" not in line and len(res) == len(c.code) + 1, (c.code.hex(), line)
        assert all(r.startswith("-22/") for r in res[:-1]), (c.code.hex(), line)
        assert res[-1] == f"0/{len(c.code)}", (c.code.hex(), line)


KNOWN = {"add", "or", "adc", "sbb", "and", "sub", "xor", "cmp", "test", "not", "neg", "inc",
         "dec", "mov", "movzx", "movsx", "movsxd", "movsb", "movsw", "movsd", "movsq", "stosb",
         "stosw", "stosd", "stosq"}
FUZZ_PREFIXES = [0x66, 0xF0, 0xF3, 0xF2, 0x2E, 0x3E, 0x26, 0x36, 0x64, 0x67, *range(0x40, 0x50)]
FUZZ_OPCODES = [*range(0x00, 0x40), *range(0x80, 0x88), 0xF6, 0xF7, 0xFE, 0xFF, 0x88, 0x89,
                0x8A, 0x8B, 0xC6, 0xC7, 0x0F, 0x63, 0xA4, 0xA5, 0xAA, 0xAB]


def test_what_the_alu_decoder_takes_capstone_reads_the_same(harness, md):  # noqa: F811
    """Random prefixes, opcodes of the families and bytes: whatever
    ng_decode_alu() takes is, to capstone, an instruction of the same
    length, one it knows, with one memory operand of its width, unlocked."""
    rng = random.Random(3)
    codes = []
    for _ in range(40_000):
        pre = bytes(rng.choice(FUZZ_PREFIXES) for _ in range(rng.choice([0, 0, 1, 1, 2, 3, 5])))
        code = pre + bytes([rng.choice(FUZZ_OPCODES)]) + rng.randbytes(14)
        codes.append(code[:rng.randint(1, 20)])
    out = harness.run([f"LD {c.hex()}" for c in codes])
    taken, bad = 0, []
    for c, line in zip(codes, out, strict=True):
        fields = line.split()
        if fields[0] != "0":
            assert fields[0] == "-22", (c.hex(), line)
            continue
        taken += 1
        length, width = int(fields[1]), int(fields[4])
        insn = next(md.disasm(c[:length], CODE), None)
        if insn is None or insn.size != length:
            bad.append(f"{c.hex()}: length {length}, capstone {insn and insn.size}")
            continue
        words = insn.mnemonic.split()
        mem = [op.size for op in insn.operands if op.type == x86.X86_OP_MEM]
        string = words[-1].startswith(("movs", "stos")) and words[-1] not in ("movsx", "movsxd")
        if words[-1] not in KNOWN or "lock" in words or (not string and mem != [width]):
            bad.append(f"{c.hex()}: {insn.mnemonic} {insn.op_str}: width {width}, memory {mem}")
    assert not bad, "\n".join(bad[:20])
    assert taken > 5000
