"""Python mirror of bpf/ksym.h (checked against the compiled header by
tests/unit/test_abi.py)."""

from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Final

NG_KSYM_MAX_WATCHES: Final = 4
NG_KSYM_COMM_LEN: Final = 16
NG_KSYM_HIST_ENTRIES: Final = 16384


class NgKsymConfig(IntEnum):
    """enum ng_ksym_config (members keep the C names)."""

    NG_KSYM_CONFIG_HISTOGRAM = 0
    NG_KSYM_CONFIG_SLOTS = 1


class NgKsymWatch(ctypes.Structure):
    _fields_ = [
        ("slot", ctypes.c_uint32),
        ("len", ctypes.c_uint32),
    ]


class NgKsymHit(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("lost", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("cpu", ctypes.c_uint16),
        ("slot", ctypes.c_uint16),
        ("pad", ctypes.c_uint32),
        ("comm", ctypes.c_char * NG_KSYM_COMM_LEN),
    ]


class NgKsymKey(ctypes.Structure):
    _fields_ = [
        ("ip", ctypes.c_uint64),
        ("slot", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


C_PREFIX: Final = "NG_KSYM_"
C_STRUCTS: Final[dict[str, type[ctypes.Structure]]] = {
    "ng_ksym_watch": NgKsymWatch,
    "ng_ksym_hit": NgKsymHit,
    "ng_ksym_key": NgKsymKey,
}
C_ENUMS: Final[dict[str, type[IntEnum]]] = {
    "ng_ksym_config": NgKsymConfig,
}
