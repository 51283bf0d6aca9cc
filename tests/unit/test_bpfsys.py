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


def test_prog_info_offsets_are_linux_bpf_h(tmp_path: Path) -> None:
    """PROG_INFO_FIELDS against struct bpf_prog_info, compiled."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "needs a C compiler (tests/setup.sh installs it)"
    fields = "".join(f'\tprintf("{n} %zu %zu\\n", offsetof(struct bpf_prog_info, {n}), '
                     f'sizeof(((struct bpf_prog_info *)0)->{n}));\n'
                     for n in bpfsys.PROG_INFO_FIELDS)
    src = tmp_path / "info.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <linux/bpf.h>\n"
                   "int main(void)\n{\n" + fields +
                   '\tprintf("verified_insns_end %zu\\n", '
                   "offsetof(struct bpf_prog_info, verified_insns) + 4);\n\treturn 0;\n}\n")
    subprocess.run([cc, "-o", str(tmp_path / "info"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "info")], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    got = {line.split()[0]: [int(x) for x in line.split()[1:]] for line in out if line}
    for name, (off, fmt) in bpfsys.PROG_INFO_FIELDS.items():
        assert got[name] == [off, struct.calcsize(fmt)], name
    assert bpfsys.PROG_INFO_SIZE >= got["verified_insns_end"][0]


def test_prog_info_counts_runs_while_statistics_are_on(fds) -> None:
    prog = bpfsys.prog_load(BPF_PROG_TYPE_SOCKET_FILTER, "test_runs", MOV_R0_0 + EXIT,
                            "GPL", 0)
    fds.append(prog)
    before = bpfsys.prog_info(prog)
    assert before["id"] > 0 and before["run_cnt"] == 0 and before["recursion_misses"] == 0
    stats = bpfsys.enable_stats()
    try:
        data = ctypes.create_string_buffer(64)
        # BPF_PROG_TEST_RUN: prog_fd, retval, data_size_in, data_size_out,
        # data_in, data_out, repeat
        bpfsys._bpf(10, struct.pack("<IIIIQQI", prog, 0, 64, 0, ctypes.addressof(data), 0, 5))
    finally:
        os.close(stats)
    after = bpfsys.prog_info(prog)
    assert after["id"] == before["id"]
    assert after["run_cnt"] == 5
    assert after["run_time_ns"] > 0
    assert after["recursion_misses"] == 0
