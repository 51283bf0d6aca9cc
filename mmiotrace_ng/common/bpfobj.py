"""The BPF programs as bytecode plus map descriptions, compiled once per
kernel and source and then cached.

bcc compiles C at every start: 6-10 s in a TCG guest, a second or two on
hardware, most of it clang parsing headers.  The result depends only on the
sources, the flags, the kernel and bcc, so it is kept (root-only) under
/var/cache/mmiotrace-ng/bpf and loaded directly on later starts.

bcc creates the maps while compiling and writes their file descriptors into
the bytecode (ld_imm64 with src_reg BPF_PSEUDO_MAP_FD).  An object records
which descriptor was which map; `relocate` rewrites them to the descriptors
of freshly created maps.
"""

from __future__ import annotations

import json
import platform
import struct
from pathlib import Path
from typing import NamedTuple

from .cachedir import read_text, store_text

FORMAT = 1                       # bump when the cached layout changes
CACHE_DIR = Path("/var/cache/mmiotrace-ng/bpf")
INSN = struct.Struct("<BBhi")    # struct bpf_insn: code, dst:4|src:4, off, imm
BPF_LD_IMM64 = 0x18              # BPF_LD | BPF_IMM | BPF_DW: two instructions
BPF_PSEUDO_MAP_FD = 1


class ObjectError(Exception):
    """A cached object is unusable (the caller compiles afresh)."""


class MapSpec(NamedTuple):
    name: str
    fd: int                      # the descriptor the bytecode refers to
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


class BpfObject(NamedTuple):
    maps: list[MapSpec]
    progs: dict[str, bytes]      # function name -> bytecode
    license: str
    kern_version: int

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT,
            "maps": [m._asdict() for m in self.maps],
            "progs": {k: v.hex() for k, v in self.progs.items()},
            "license": self.license,
            "kern_version": self.kern_version,
        })

    @classmethod
    def from_json(cls, text: str) -> BpfObject:
        try:
            d = json.loads(text)
            if d.get("format") != FORMAT:
                raise ObjectError(f"format {d.get('format')}, not {FORMAT}")
            return cls([MapSpec(**m) for m in d["maps"]],
                       {k: bytes.fromhex(v) for k, v in d["progs"].items()},
                       str(d["license"]), int(d["kern_version"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ObjectError(f"malformed object: {exc}") from exc


def relocate(code: bytes, fds: dict[int, int]) -> bytes:
    """code with every map descriptor f replaced by fds[f]."""
    if len(code) % INSN.size:
        raise ObjectError(f"bytecode of {len(code)} bytes is not whole instructions")
    out = bytearray(code)
    i, n = 0, len(code) // INSN.size
    while i < n:
        op, regs, off, imm = INSN.unpack_from(out, i * INSN.size)
        if op != BPF_LD_IMM64:
            i += 1
            continue
        if i + 1 >= n:
            raise ObjectError("ld_imm64 at the end of the bytecode")
        if regs >> 4 == BPF_PSEUDO_MAP_FD:
            if imm not in fds:
                raise ObjectError(f"the bytecode refers to unknown map descriptor {imm}")
            INSN.pack_into(out, i * INSN.size, op, regs, off, fds[imm])
        i += 2
    return bytes(out)


def new_sha256():  # noqa: ANN202 (hashlib's private type)
    """SHA-256 from Python's own module: hashlib loads OpenSSL's libcrypto
    first, a tenth of a second of every start in a TCG guest."""
    try:
        from _sha256 import sha256  # Python <= 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # Python >= 3.12
        except ImportError:
            from hashlib import sha256
    return sha256()


def cache_key(source: Path, headers: list[Path], cflags: list[str], bcc_version: str) -> str:
    """What the compiled object depends on: sources, flags, kernel and bcc.
    Not where the sources are: an include directory counts by its name (its
    headers by their contents), so a checkout and an installed copy of the
    same sources share one object."""
    h = new_sha256()
    flags = [f"-I{Path(f[2:]).name}" if f.startswith("-I") else f for f in cflags]
    for part in (str(FORMAT), platform.release(), platform.version(), bcc_version,
                 *flags):
        h.update(part.encode() + b"\0")
    for path in (source, *sorted(headers)):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def load_cached(key: str, cache_dir: Path = CACHE_DIR) -> BpfObject | None:
    text = read_text(cache_dir, f"{key}.json")
    if text is None:
        return None
    try:
        return BpfObject.from_json(text)
    except ObjectError:
        return None


def store(key: str, obj: BpfObject, cache_dir: Path = CACHE_DIR) -> None:
    """Best effort: a cache that cannot be written only costs time."""
    store_text(cache_dir, f"{key}.json", obj.to_json())
