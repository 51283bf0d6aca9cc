"""bpfsys: the bpf(2) and perf_event_open(2) calls, against this host's kernel
(maps and program loads; the kprobe PMU only in the guest tests, which
attach every program through it)."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

import pytest

from mmiotrace_ng.common import bpfsys
from mmiotrace_ng.common.bpfload import LoaderError, load_program
from mmiotrace_ng.common.bpfobj import BpfObject

BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_ARRAY = 1, 2
BPF_PROG_TYPE_SOCKET_FILTER = 1
MOV_R0_0 = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0])
EXIT = bytes([0x95, 0, 0, 0, 0, 0, 0, 0])


@pytest.fixture
def fds():
    made: list[int] = []
    yield made
    for fd in made:
        os.close(fd)


def test_array_map_update_and_lookup(fds) -> None:
    fd = bpfsys.map_create(BPF_MAP_TYPE_ARRAY, "test_array", 4, 8, 4)
    fds.append(fd)
    bpfsys.map_update(fd, ctypes.c_int(2), ctypes.c_uint64(0x1122334455667788))
    out = ctypes.c_uint64()
    bpfsys.map_lookup(fd, ctypes.c_int(2), out)
    assert out.value == 0x1122334455667788
    bpfsys.map_lookup(fd, ctypes.c_int(1), out)
    assert out.value == 0
    with pytest.raises(OSError) as exc:
        bpfsys.map_lookup(fd, ctypes.c_int(4), out)      # past max_entries
    assert exc.value.errno == errno.ENOENT


def test_hash_map_walk(fds) -> None:
    fd = bpfsys.map_create(BPF_MAP_TYPE_HASH, "test_hash", 8, 4, 16)
    fds.append(fd)
    assert bpfsys.map_items(fd, ctypes.c_uint64, ctypes.c_uint32) == []
    assert not bpfsys.map_next_key(fd, None, ctypes.c_uint64())
    want = {7: 70, 1 << 40: 1, 3: 0xFFFFFFFF}
    for k, v in want.items():
        bpfsys.map_update(fd, ctypes.c_uint64(k), ctypes.c_uint32(v))
    got = {k.value: v.value for k, v in bpfsys.map_items(fd, ctypes.c_uint64, ctypes.c_uint32)}
    assert got == want


def test_map_create_refused() -> None:
    with pytest.raises(OSError) as exc:
        bpfsys.map_create(BPF_MAP_TYPE_ARRAY, "bad", 4, 8, 0)    # no entries
    assert exc.value.errno == errno.EINVAL


def test_program_load_and_verifier_log(fds) -> None:
    fds.append(bpfsys.prog_load(BPF_PROG_TYPE_SOCKET_FILTER, "test_ok", MOV_R0_0 + EXIT,
                                "GPL", 0))
    log = ctypes.create_string_buffer(1 << 16)
    with pytest.raises(OSError) as exc:         # r0 never set
        bpfsys.prog_load(BPF_PROG_TYPE_SOCKET_FILTER, "test_bad", EXIT, "GPL", 0, log)
    assert exc.value.errno == errno.EACCES
    assert b"R0" in log.value


def test_load_program_says_the_verifiers_reasons() -> None:
    obj = BpfObject([], {"bad": EXIT}, "GPL", 0)
    with pytest.raises(LoaderError) as exc:
        load_program(BPF_PROG_TYPE_SOCKET_FILTER, "bad", obj, {})
    assert "refused the BPF program bad" in str(exc.value)
    assert "R0" in str(exc.value)


def test_names_are_cut_as_the_kernel_takes_them() -> None:
    assert bpfsys._name("on_ioremap_return") == b"on_ioremap_retu"
    assert bpfsys._name("a-b:c") == b"abc"


def test_cpu_list() -> None:
    assert bpfsys.cpu_list("0-3,5\n") == {0, 1, 2, 3, 5}
    assert bpfsys.cpu_list("0") == {0}
    assert bpfsys.possible_cpus() == len(bpfsys.cpu_list(
        Path("/sys/devices/system/cpu/possible").read_text()))


def test_kprobe_attr_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "format").mkdir()
    (tmp_path / "type").write_text("6\n")
    (tmp_path / "format" / "retprobe").write_text("config:0\n")
    monkeypatch.setattr(bpfsys, "KPROBE_PMU", tmp_path)
    for ret in (False, True):
        attr, name = bpfsys.kprobe_attr("iounmap", ret)
        assert len(attr) == bpfsys.PERF_ATTR_SIZE
        typ, size, config = struct.unpack_from("<IIQ", attr)
        flags, = struct.unpack_from("<Q", attr, 40)
        func, offset = struct.unpack_from("<QQ", attr, 56)
        assert (typ, size, config, flags) == (6, 112, int(ret), 1)
        assert func == ctypes.addressof(name) and name.value == b"iounmap"
        assert offset == 0
