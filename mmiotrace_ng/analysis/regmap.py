"""Register maps: the names (and bit fields) of a device's registers, so that
`annotate` can print `STATUS 0x80080783 {FD=1 LU=1 SPEED=1000}` instead of an
offset and a number.

A map is a small text file (NAME.regs; docs/regmap.md has a worked example):

    # comments run from # to the end of the line; blank lines are ignored
    device 8086:100e 8086:100f bar 0     # what the map is for (repeatable)

    0x0000 4 CTRL      Device Control     # OFFSET WIDTH NAME [description]
      0      FD                           # a field: BITS NAME [VALUE=LABEL ...]
      9:8    SPD_SEL 0=10 1=100 2=1000 3=1000  forced speed
    0x5400+8*16 4 RAL%d Receive Address Low     # an array: 16 registers,
                                                # RAL0 at 0x5400 ... RAL15 at 0x5478

- `device VVVV:DDDD [VVVV:DDDD ...] [bar N]` (hex PCI vendor:device ids, BAR
  0-5, bar 0 if not said): the map names the registers of that BAR of a
  device with one of those ids (the trace's PCIDEV lines give each device's
  ids and BAR addresses).  At least one such line.
- A register line starts in the first column: OFFSET (hex, with 0x: the
  register's byte offset in the BAR), WIDTH (bytes: 1, 2, 4 or 8), NAME
  (letters, digits, _ and .), then an optional description (free text).
  OFFSET may be `0xBASE+STRIDE*COUNT` (STRIDE and COUNT decimal, or hex
  with 0x): COUNT registers, the n-th at BASE + n*STRIDE; NAME then holds %d
  where the index goes (RAL%d: RAL0, RAL1, ...) or gets it as [n] (MTA[5]).
- A field line is indented and belongs to the register line above it: BITS
  is one bit (`31`) or a range high:low (`7:6`), decimal, inside the
  register; NAME as above; then VALUE=LABEL words (VALUE decimal or 0x hex,
  LABEL without spaces) that name the field's values; the first word that
  is not VALUE=LABEL starts the field's description.
- Registers (array elements included) may not overlap, nor may the fields
  of one register; names are unique.  Anything else is an error that names
  the file and line (errors.UsageError).

Decoding shows the fields whose value is not zero or has a label, as
NAME=LABEL or NAME=value (decimal below 10, else hex), and the set bits no
field covers as ?=0x...; registers without fields show their value only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ..common.errors import UsageError

SHIPPED_DIR: Final = Path(__file__).resolve().parents[1] / "data" / "regs"
SUFFIX: Final = ".regs"
WIDTHS: Final = (1, 2, 4, 8)
EXPAND_LIMIT: Final = 4096      # arrays up to this many elements are looked up by dict

_NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_NUM = r"(?:0x[0-9a-fA-F]+|[0-9]+)"
_OFFSET_RE: Final = re.compile(rf"0x([0-9a-fA-F]+)(?:\+({_NUM})\*({_NUM}))?")
_NAME_RE: Final = re.compile(rf"{_NAME}")
_ARRAY_NAME_RE: Final = re.compile(rf"{_NAME}(?:%d[A-Za-z0-9_.]*)?")
_BITS_RE: Final = re.compile(r"([0-9]+)(?::([0-9]+))?")
_ENUM_RE: Final = re.compile(rf"({_NUM})=(\S+)")
_ID_RE: Final = re.compile(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{4})")


def _int(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


@dataclass(frozen=True)
class Field:
    """Bits hi..lo of a register."""

    hi: int
    lo: int
    name: str
    enums: dict[int, str] = field(default_factory=dict)
    description: str = ""
    line: int = 0

    @property
    def mask(self) -> int:
        return ((1 << (self.hi - self.lo + 1)) - 1) << self.lo

    def show(self, value: int) -> str | None:
        """NAME=LABEL or NAME=value for this field of the register's value,
        None if it is zero with no label."""
        v = (value & self.mask) >> self.lo
        if v in self.enums:
            return f"{self.name}={self.enums[v]}"
        if not v:
            return None
        return f"{self.name}={v}" if v < 10 else f"{self.name}=0x{v:x}"


@dataclass
class Register:
    """One register, or an array of COUNT alike at a STRIDE."""

    offset: int
    width: int
    name: str
    count: int = 1
    stride: int = 0
    description: str = ""
    fields: list[Field] = field(default_factory=list)
    line: int = 0

    @property
    def end(self) -> int:
        """One past the last byte of the last element."""
        return self.offset + (self.count - 1) * self.stride + self.width

    def element(self, index: int) -> str:
        """The name of element index (the register's name if not an array)."""
        if self.count == 1 and not self.stride:
            return self.name
        if "%d" in self.name:
            return self.name.replace("%d", str(index))
        return f"{self.name}[{index}]"

    def decode(self, value: int, shift: int = 0, bits: int | None = None) -> str:
        """`{F1=.. F2=.. ?=0x..}` for value, read from byte shift/8 of the
        register on and bits wide (default: the whole register); only the
        fields wholly inside what was read are shown."""
        lo = shift
        hi = min(self.width * 8, shift + (bits if bits is not None else self.width * 8))
        seen = ((1 << hi) - 1) & ~((1 << lo) - 1)
        v = (value << shift) & seen
        parts = []
        covered = 0
        for f in self.fields:
            if f.mask & seen != f.mask:
                continue
            covered |= f.mask
            text = f.show(v)
            if text is not None:
                parts.append(text)
        rest = v & ~covered
        if rest:
            parts.append(f"?=0x{rest:x}")
        return "{" + " ".join(parts) + "}"


@dataclass(frozen=True)
class Target:
    """A BAR of a PCI device the map is for."""

    vendor: int
    device: int
    bar: int

    def __str__(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x} BAR{self.bar}"


@dataclass
class Hit:
    """Where an offset falls: in register reg, element index, byte delta
    into it."""

    reg: Register
    index: int
    delta: int

    @property
    def name(self) -> str:
        base = self.reg.element(self.index)
        return f"{base}+{self.delta}" if self.delta else base


class RegMap:
    """A parsed map: what it is for (targets) and its registers, with
    lookups by offset."""

    def __init__(self, name: str, source: str, targets: list[Target],
                 registers: list[Register]) -> None:
        self.name = name            # the file's name, e.g. e1000.regs
        self.source = source        # its path
        self.targets = targets
        self.registers = registers
        self._starts: dict[int, tuple[Register, int]] = {}
        self._big: list[Register] = []
        self._max_width = max((r.width for r in registers), default=1)
        for r in registers:
            if r.count > EXPAND_LIMIT:
                self._big.append(r)
                continue
            for i in range(r.count):
                self._starts[r.offset + i * r.stride] = (r, i)

    def lookup(self, offset: int) -> Hit | None:
        """The register (element) whose bytes hold offset, if any."""
        for delta in range(self._max_width):
            got = self._starts.get(offset - delta)
            if got is not None:
                reg, index = got
                return Hit(reg, index, delta) if delta < reg.width else None
        for r in self._big:
            if r.offset <= offset < r.end:
                index, delta = divmod(offset - r.offset, r.stride)
                if delta < r.width:
                    return Hit(r, index, delta)
        return None

    def describe(self, offset: int, width: int, value: int) -> tuple[str, str] | None:
        """(name, fields) of an access of width bytes at offset that read or
        wrote value; fields is "" for a register without fields.  None if
        no register is there."""
        hit = self.lookup(offset)
        if hit is None:
            return None
        fields = hit.reg.decode(value, hit.delta * 8, width * 8) if hit.reg.fields else ""
        return hit.name, fields

    def bars_for(self, vendor: int, device: int) -> list[int]:
        """The BARs of a device with these ids that the map names."""
        return [t.bar for t in self.targets if (t.vendor, t.device) == (vendor, device)]


# --- parsing -------------------------------------------------------------------


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.targets: list[Target] = []
        self.registers: list[Register] = []
        self.names: dict[str, int] = {}

    def error(self, lineno: int, message: str) -> UsageError:
        return UsageError(f"{self.source}:{lineno}: {message}")

    def device(self, lineno: int, words: list[str]) -> None:
        ids: list[tuple[int, int]] = []
        bar = 0
        i = 1
        while i < len(words):
            w = words[i]
            if w == "bar":
                if i + 2 != len(words):
                    raise self.error(lineno, "'bar N' comes last on a device line")
                if not words[i + 1].isdigit() or int(words[i + 1]) > 5:
                    raise self.error(lineno, f"bar {words[i + 1]!r}: a BAR is 0 to 5")
                bar = int(words[i + 1])
                break
            m = _ID_RE.fullmatch(w)
            if not m:
                raise self.error(lineno, f"device id {w!r}: expected VVVV:DDDD (hex vendor:device)")
            ids.append((int(m[1], 16), int(m[2], 16)))
            i += 1
        if not ids:
            raise self.error(lineno, "a device line needs at least one VVVV:DDDD id")
        for vendor, device in ids:
            t = Target(vendor, device, bar)
            if t in self.targets:
                raise self.error(lineno, f"{t} is listed twice")
            self.targets.append(t)

    def register(self, lineno: int, text: str) -> None:
        words = text.split(None, 3)
        if len(words) < 3:
            raise self.error(lineno, f"expected OFFSET WIDTH NAME [description], got {text!r}")
        off_word, width_word, name = words[:3]
        m = _OFFSET_RE.fullmatch(off_word)
        if not m:
            raise self.error(lineno, f"offset {off_word!r}: expected hex with 0x, 0xOFFSET "
                             "or 0xBASE+STRIDE*COUNT")
        offset = int(m[1], 16)
        count, stride = 1, 0
        if m[2] is not None:
            stride, count = _int(m[2]), _int(m[3])
            if count < 1:
                raise self.error(lineno, f"array of {count} registers")
        if not width_word.isdigit() or int(width_word) not in WIDTHS:
            raise self.error(lineno, f"width {width_word!r}: expected 1, 2, 4 or 8 (bytes)")
        width = int(width_word)
        if m[2] is not None and stride < width:
            raise self.error(lineno, f"stride {stride} is less than the width {width}: "
                             "the elements would overlap")
        array = m[2] is not None
        if not (_ARRAY_NAME_RE if array else _NAME_RE).fullmatch(name):
            hint = " (%d is for arrays only)" if "%d" in name else ""
            raise self.error(lineno, f"register name {name!r}: letters, digits, _ and . "
                             f"only{hint}")
        if name in self.names:
            raise self.error(lineno, f"register {name} is defined twice (first on line "
                             f"{self.names[name]})")
        self.names[name] = lineno
        self.registers.append(Register(offset, width, name, count, stride,
                                       words[3].strip() if len(words) > 3 else "",
                                       [], lineno))

    def field(self, lineno: int, text: str) -> None:
        if not self.registers:
            raise self.error(lineno, "an indented line (a field) before any register")
        reg = self.registers[-1]
        words = text.split()
        if len(words) < 2:
            raise self.error(lineno, f"expected BITS NAME [VALUE=LABEL ...], got {text.strip()!r}")
        m = _BITS_RE.fullmatch(words[0])
        if not m:
            raise self.error(lineno, f"bits {words[0]!r}: expected N or HIGH:LOW (decimal)")
        hi = int(m[1])
        lo = int(m[2]) if m[2] is not None else hi
        if hi < lo:
            raise self.error(lineno, f"bits {words[0]}: the high bit comes first (HIGH:LOW)")
        if hi >= reg.width * 8:
            raise self.error(lineno, f"bit {hi} is outside {reg.name}, a {reg.width * 8}-bit "
                             "register")
        name = words[1]
        if not _NAME_RE.fullmatch(name):
            raise self.error(lineno, f"field name {name!r}: letters, digits, _ and . only")
        enums: dict[int, str] = {}
        rest = words[2:]
        while rest and (e := _ENUM_RE.fullmatch(rest[0])):
            value = _int(e[1])
            if value >= 1 << (hi - lo + 1):
                raise self.error(lineno, f"value {e[1]} does not fit the {hi - lo + 1}-bit "
                                 f"field {name}")
            if value in enums:
                raise self.error(lineno, f"value {e[1]} of {name} is named twice")
            enums[value] = e[2]
            rest = rest[1:]
        new = Field(hi, lo, name, enums, " ".join(rest), lineno)
        for f in reg.fields:
            if f.name == name:
                raise self.error(lineno, f"field {name} of {reg.name} is defined twice "
                                 f"(first on line {f.line})")
            if f.mask & new.mask:
                raise self.error(lineno, f"field {name} overlaps field {f.name} (line "
                                 f"{f.line}) of {reg.name}")
        reg.fields.append(new)

    def check_overlaps(self) -> None:
        """No byte belongs to two registers (array elements included)."""
        regs = sorted(self.registers, key=lambda r: (r.offset, r.line))
        active: list[Register] = []
        for r in regs:
            active = [a for a in active if a.end > r.offset]
            for a in active:
                clash = _first_clash(a, r)
                if clash is not None:
                    later, earlier = (r, a) if r.line > a.line else (a, r)
                    raise self.error(later.line, f"{later.name} overlaps {earlier.name} "
                                     f"(line {earlier.line}) at offset 0x{clash:x}")
            active.append(r)


def _first_clash(a: Register, b: Register) -> int | None:
    """An offset that an element of a and one of b both hold, if any."""
    small, big = (a, b) if a.count <= b.count else (b, a)
    step = big.stride or 1
    for i in range(small.count):
        s = small.offset + i * small.stride
        e = s + small.width
        # the first element k of big that may reach s: big.offset + k*step + big.width > s
        k_lo = max(0, (s - big.offset - big.width) // step + 1) if big.count > 1 else 0
        for k in range(k_lo, big.count):
            bs = big.offset + k * big.stride
            if bs >= e:
                break
            if bs + big.width > s:
                return max(s, bs)
    return None


def parse(text: str, source: str = "<map>") -> RegMap:
    """The map that text (a .regs file's contents) describes; UsageError
    naming source and the line if it is not a valid map."""
    p = _Parser(source)
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if line[0] in " \t":
            p.field(lineno, line)
            continue
        words = line.split()
        if words[0] == "device":
            p.device(lineno, words)
        elif words[0][0].isdigit():
            p.register(lineno, line)
        else:
            raise p.error(lineno, f"expected a register (OFFSET WIDTH NAME, OFFSET in hex "
                          f"with 0x), an indented field or 'device VVVV:DDDD bar N'; got "
                          f"{words[0]!r}")
    if not p.targets:
        raise UsageError(f"{source}: no 'device VVVV:DDDD bar N' line: the map must say "
                         "which device it is for")
    if not p.registers:
        raise UsageError(f"{source}: no registers")
    p.check_overlaps()
    return RegMap(Path(source).name, source, p.targets, p.registers)


def load(path: str | Path) -> RegMap:
    """The map in a file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read register map {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"register map {path} is not UTF-8 text") from exc
    return parse(text, str(path))


def shipped() -> list[str]:
    """The names of the maps that come with mmiotrace-ng (e1000, edu, ...)."""
    return sorted(p.stem for p in SHIPPED_DIR.glob(f"*{SUFFIX}"))


def find(spec: str) -> RegMap:
    """The map spec names: a file (a path, or anything ending in .regs), or
    the name of a shipped map."""
    p = Path(spec)
    if "/" in spec or spec.endswith(SUFFIX) or p.is_file():
        return load(p)
    path = SHIPPED_DIR / f"{spec}{SUFFIX}"
    if not path.is_file():
        names = ", ".join(shipped()) or "none"
        raise UsageError(f"no register map {spec!r} (shipped: {names}; or give a file)")
    return load(path)


def load_shipped() -> list[RegMap]:
    return [load(SHIPPED_DIR / f"{name}{SUFFIX}") for name in shipped()]
