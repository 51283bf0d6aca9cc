"""The cached BPF object: relocation of map descriptors, serialization, the
cache key and the cache's trust rules."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from mmiotrace_ng.common.bpfobj import (
    BPF_LD_IMM64,
    BpfObject,
    MapSpec,
    ObjectError,
    cache_key,
    load_cached,
    relocate,
    store,
)

INSN = struct.Struct("<BBhi")
MOV64_IMM = 0xB7
CALL = 0x85
EXIT = 0x95


def ld_map_fd(dst: int, fd: int) -> bytes:
    return INSN.pack(BPF_LD_IMM64, 1 << 4 | dst, 0, fd) + INSN.pack(0, 0, 0, 0)


def ld_imm64(dst: int, value: int) -> bytes:
    return INSN.pack(BPF_LD_IMM64, dst, 0, value) + INSN.pack(0, 0, 0, 0)


def imms(code: bytes) -> list[int]:
    return [imm for _op, _regs, _off, imm in INSN.iter_unpack(code)]


def test_relocate_rewrites_map_descriptors_only() -> None:
    code = (INSN.pack(MOV64_IMM, 1, 0, 3) + ld_map_fd(1, 3) + ld_imm64(2, 4)
            + ld_map_fd(1, 4) + INSN.pack(CALL, 0, 0, 131) + INSN.pack(EXIT, 0, 0, 0))
    out = relocate(code, {3: 4, 4: 3})        # a swap: no chained rewriting
    assert imms(out) == [3, 4, 0, 4, 0, 3, 0, 131, 0]
    assert len(out) == len(code)


def test_relocate_rejects_unknown_descriptors_and_torn_code() -> None:
    with pytest.raises(ObjectError, match="unknown map descriptor 9"):
        relocate(ld_map_fd(1, 9), {3: 5})
    with pytest.raises(ObjectError, match="end of the bytecode"):
        relocate(INSN.pack(BPF_LD_IMM64, 1 << 4, 0, 3), {3: 5})
    with pytest.raises(ObjectError, match="whole instructions"):
        relocate(b"\0" * 12, {})


OBJ = BpfObject([MapSpec("events", 3, 27, 0, 0, 1 << 24, 0),
                 MapSpec("drops", 4, 6, 4, 8, 2, 0)],
                {"on_access": ld_map_fd(1, 3) + INSN.pack(EXIT, 0, 0, 0)}, "GPL", 0x60100)


def test_json_round_trip_and_malformed() -> None:
    assert BpfObject.from_json(OBJ.to_json()) == OBJ
    for bad in ("", "[]", '{"format": 99}', '{"format": 1, "maps": [{"name": "x"}]}'):
        with pytest.raises(ObjectError):
            BpfObject.from_json(bad)


def test_cache_key_follows_sources_and_flags(tmp_path: Path) -> None:
    src, hdr = tmp_path / "p.bpf.c", tmp_path / "p.h"
    src.write_text("int x;")
    hdr.write_text("#define A 1")
    key = cache_key(src, [hdr], ["-DX=1"], "0.26")
    assert key == cache_key(src, [hdr], ["-DX=1"], "0.26")
    assert key != cache_key(src, [hdr], ["-DX=2"], "0.26")
    assert key != cache_key(src, [hdr], ["-DX=1"], "0.27")
    hdr.write_text("#define A 2")
    assert key != cache_key(src, [hdr], ["-DX=1"], "0.26")


def test_cache_key_is_the_same_for_a_copy_of_the_sources(tmp_path: Path) -> None:
    """A checkout's bpf/ and an installed package's data/bpf: one object."""
    keys = []
    for where in ("checkout/bpf", "venv/lib/data/bpf"):
        d = tmp_path / where
        d.mkdir(parents=True)
        (d / "p.bpf.c").write_text("int x;")
        (d / "p.h").write_text("#define A 1")
        keys.append(cache_key(d / "p.bpf.c", [d / "p.h"], [f"-I{d}", "-DX=1"], "0.26"))
    assert keys[0] == keys[1]
    other = tmp_path / "venv/lib/data/include"
    other.mkdir()
    assert keys[0] != cache_key(tmp_path / where / "p.bpf.c", [tmp_path / where / "p.h"],
                                [f"-I{other}", "-DX=1"], "0.26")


def test_store_and_load_only_from_a_private_directory(tmp_path: Path) -> None:
    cache = tmp_path / "bpf"
    store("k1", OBJ, cache)
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)
    assert load_cached("k1", cache) == OBJ
    assert load_cached("k2", cache) is None
    (cache / "k3.json").write_text("{not json")
    assert load_cached("k3", cache) is None          # corrupt: compiled afresh
    os.chmod(cache, 0o777)
    assert load_cached("k1", cache) is None          # others could have written it
