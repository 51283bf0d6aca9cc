"""The bpf(2) and perf_event_open(2) calls the tracers make, through libc.

A cached BPF object (bpfobj.py) needs no compiler: its maps are created, its
programs loaded and attached with these few system calls.  Going through
libbcc for them would load libbcc and the LLVM and clang libraries it links,
the slowest part of a cached start (seconds under TCG).  bcc is imported
only to compile (loader.compile_object).

Every function raises OSError with the kernel's errno when the call fails.
The layouts are the kernel's union bpf_attr and struct perf_event_attr
(include/uapi/linux/bpf.h, perf_event.h); fields not named stay zero.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
from pathlib import Path

NR_BPF = 321                               # x86_64
NR_PERF_EVENT_OPEN = 298
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM = 0, 1, 2
BPF_MAP_GET_NEXT_KEY, BPF_PROG_LOAD, BPF_RAW_TRACEPOINT_OPEN = 4, 5, 17
BPF_OBJ_GET_INFO_BY_FD, BPF_ENABLE_STATS, BPF_STATS_RUN_TIME = 15, 32, 0
# struct bpf_prog_info (include/uapi/linux/bpf.h): the fields read, by offset
PROG_INFO_SIZE = 224                       # up to verified_insns (5.16)
PROG_INFO_FIELDS = {"id": (4, "I"), "run_time_ns": (192, "Q"), "run_cnt": (200, "Q"),
                    "recursion_misses": (208, "Q")}
BPF_OBJ_NAME_LEN = 16
ATTR_SIZE = 128                            # more than any command below uses
PERF_ATTR_SIZE = 112                       # PERF_ATTR_SIZE_VER5
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_SET_BPF = 0x40042408        # _IOW('$', 8, __u32)
KPROBE_PMU = Path("/sys/bus/event_source/devices/kprobe")
POSSIBLE = Path("/sys/devices/system/cpu/possible")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _fail() -> OSError:
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err))


def _bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)
    ret = _libc.syscall(ctypes.c_long(NR_BPF), ctypes.c_long(cmd), buf,
                        ctypes.c_ulong(ATTR_SIZE))
    if ret < 0:
        raise _fail()
    return ret


def _name(name: str) -> bytes:
    """An object name as the kernel takes it: at most 15 characters of
    [A-Za-z0-9_.] (as libbpf and bcc cut them)."""
    return "".join(c for c in name if c.isalnum() or c in "_.")[:BPF_OBJ_NAME_LEN - 1].encode()


def map_create(map_type: int, name: str, key_size: int, value_size: int,
               max_entries: int, flags: int = 0) -> int:
    return _bpf(BPF_MAP_CREATE, struct.pack("<IIIIIII16s", map_type, key_size, value_size,
                                            max_entries, flags, 0, 0, _name(name)))


def prog_load(prog_type: int, name: str, code: bytes, license: str, kern_version: int,
              log: ctypes.Array[ctypes.c_char] | None = None) -> int:
    """A program's descriptor; with a log buffer, the verifier writes its
    reasons there (a log that does not fit makes the load fail: ENOSPC)."""
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(license.encode())
    log_addr = ctypes.addressof(log) if log is not None else 0
    log_size = ctypes.sizeof(log) if log is not None else 0
    attr = struct.pack("<IIQQIIQII16s", prog_type, len(code) // 8, ctypes.addressof(insns),
                       ctypes.addressof(lic), 1 if log is not None else 0, log_size, log_addr,
                       kern_version, 0, _name(name))
    return _bpf(BPF_PROG_LOAD, attr)


def _elem(cmd: int, fd: int, key: ctypes._CData | None, value: ctypes._CData,
          flags: int = 0) -> None:
    _bpf(cmd, struct.pack("<IIQQQ", fd, 0, ctypes.addressof(key) if key is not None else 0,
                          ctypes.addressof(value), flags))


def map_lookup(fd: int, key: ctypes._CData, value: ctypes._CData) -> None:
    _elem(BPF_MAP_LOOKUP_ELEM, fd, key, value)


def map_update(fd: int, key: ctypes._CData, value: ctypes._CData, flags: int = 0) -> None:
    _elem(BPF_MAP_UPDATE_ELEM, fd, key, value, flags)


def map_next_key(fd: int, key: ctypes._CData | None, next_key: ctypes._CData) -> bool:
    """The key after key (the first with None) into next_key; False after the last."""
    try:
        _elem(BPF_MAP_GET_NEXT_KEY, fd, key, next_key)
    except FileNotFoundError:
        return False
    return True


def prog_info(prog_fd: int) -> dict[str, int]:
    """Counters of a loaded program (PROG_INFO_FIELDS): run_cnt and
    run_time_ns count only while BPF statistics are on (sysctl
    kernel.bpf_stats_enabled); recursion_misses always: runs skipped because
    the program was already running on that CPU.  A kernel older than the
    field says 0 (it fills only what it knows)."""
    info = ctypes.create_string_buffer(PROG_INFO_SIZE)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", prog_fd, PROG_INFO_SIZE,
                                             ctypes.addressof(info)))
    return {name: struct.unpack_from("<" + fmt, info.raw, off)[0]
            for name, (off, fmt) in PROG_INFO_FIELDS.items()}


def enable_stats() -> int:
    """BPF statistics (prog_info's run_cnt, run_time_ns) on while the
    returned descriptor is open."""
    return _bpf(BPF_ENABLE_STATS, struct.pack("<I", BPF_STATS_RUN_TIME))


def raw_tracepoint_open(tracepoint: str, prog_fd: int) -> int:
    name = ctypes.create_string_buffer(tracepoint.encode())
    return _bpf(BPF_RAW_TRACEPOINT_OPEN, struct.pack("<QI", ctypes.addressof(name), prog_fd))


def perf_event_open(attr: bytes, pid: int, cpu: int, group_fd: int = -1) -> int:
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(ctypes.c_long(NR_PERF_EVENT_OPEN), buf, ctypes.c_int(pid),
                       ctypes.c_int(cpu), ctypes.c_int(group_fd),
                       ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        raise _fail()
    return fd


def attach_perf_event(event_fd: int, prog_fd: int) -> None:
    """Run prog on each event of event_fd, and enable it."""
    fcntl.ioctl(event_fd, PERF_EVENT_IOC_SET_BPF, prog_fd)
    fcntl.ioctl(event_fd, PERF_EVENT_IOC_ENABLE, 0)


def _pmu_value(path: Path) -> str:
    return path.read_text().strip()


def kprobe_attr(function: str, retprobe: bool) -> tuple[bytes, ctypes.Array[ctypes.c_char]]:
    """perf_event_attr of a kprobe (or kretprobe) on function's entry made by
    the kprobe PMU (no tracefs event: it goes with its descriptor), and the
    name buffer its config1 points to (keep it until the event is open)."""
    pmu = int(_pmu_value(KPROBE_PMU / "type"))
    config = 0
    if retprobe:        # "config:0": the bit that makes a return probe
        config = 1 << int(_pmu_value(KPROBE_PMU / "format" / "retprobe").split(":")[1])
    name = ctypes.create_string_buffer(function.encode())
    attr = struct.pack("<IIQQQQQIIQQ", pmu, PERF_ATTR_SIZE, config, 0, 0, 0,
                       1, 0, 0, ctypes.addressof(name), 0)    # flags 1: disabled
    return attr.ljust(PERF_ATTR_SIZE, b"\0"), name


def attach_kprobe(function: str, prog_fd: int, retprobe: bool = False) -> int:
    """The descriptor of a kprobe on function running prog (closing it detaches)."""
    attr, _keep = kprobe_attr(function, retprobe)
    fd = perf_event_open(attr, -1, 0)
    try:
        attach_perf_event(fd, prog_fd)
    except OSError:
        os.close(fd)
        raise
    return fd


def cpu_list(text: str) -> set[int]:
    """The CPUs of a sysfs CPU list ("0-3,5")."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def possible_cpus() -> int:
    """How many values a per-CPU map holds for each key."""
    return len(cpu_list(POSSIBLE.read_text()))


def map_items(fd: int, key_type: type[ctypes._CData],
              value_type: type[ctypes._CData]) -> list[tuple[ctypes._CData, ctypes._CData]]:
    """Every (key, value) of a hash map, as fresh objects of the given types
    (a key deleted during the walk is skipped)."""
    out = []
    key = None
    while map_next_key(fd, key, nxt := key_type()):
        key, val = nxt, value_type()
        try:
            map_lookup(fd, key, val)
        except FileNotFoundError:
            continue
        out.append((key, val))
    return out
