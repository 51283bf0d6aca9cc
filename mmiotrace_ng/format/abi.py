"""Python mirror of kmod/mmiotng_abi.h (the helper module's interface).

Every struct, enum and #define of that header has a counterpart here with the
same name; tests/unit/test_abi.py compiles the header on the host and checks
sizes, offsets, field types and values against this module.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum, IntFlag
from typing import Final

MMIOTNG_ABI_VERSION: Final = 10
MMIOTNG_ACCESS_TP: Final = "mmiotng_access"
MMIOTNG_MARK_TP: Final = "mmiotng_mark"
MMIOTNG_MAP_TP: Final = "mmiotng_map"
MMIOTNG_MARK_MAX: Final = 4096
MMIOTNG_INSN_BYTES: Final = 8
MMIOTNG_MAX_FILTERS: Final = 256

# enum mmiotng_op (as #defines in the header)
MMIOTNG_OP_READ: Final = 0
MMIOTNG_OP_WRITE: Final = 1
MMIOTNG_OP_UNKNOWN: Final = 2

# mmiotng_access.flags
MMIOTNG_F_SINGLESTEP: Final = 0x01
MMIOTNG_F_REP: Final = 0x02
MMIOTNG_F_USER: Final = 0x04     # from user mode, through a process's mapping

# mmiotng_map.err (negated) of a page of a process's mapping no longer traced
MMIOTNG_ERR_USER_KERNEL: Final = 67     # a kernel-mode or 32-bit access through it
MMIOTNG_ERR_USER_INSN: Final = 68       # an instruction the helper does not emulate there

# Generic netlink
MMIOTNG_GENL_NAME: Final = "mmiotrace_ng"
MMIOTNG_GENL_VERSION: Final = 1

# MMIOTNG_A_MODE values
MMIOTNG_MODE_EMULATE: Final = 0
MMIOTNG_MODE_SINGLESTEP: Final = 1
MMIOTNG_MODE_TRAP_ONLY: Final = 2   # benchmarks only (the module's test_modes=1)
# TRACE_USER's process filter
MMIOTNG_USER_MAX_PIDS: Final = 16
MMIOTNG_USER_MAX_COMMS: Final = 8
MMIOTNG_COMM_LEN: Final = 16

# the flight region (struct mmiotng_flight_hdr)
MMIOTNG_FLIGHT_MAGIC: Final = "MMIOTNGF"
MMIOTNG_FLIGHT_VERSION: Final = 1
MMIOTNG_FLIGHT_MAPS: Final = 256
MMIOTNG_FLIGHT_MSG: Final = 256
MMIOTNG_FLIGHT_TEXT: Final = 4096
MMIOTNG_FLIGHT_READ_MAX: Final = 16384
MMIOTNG_FLIGHT_MIN_RECS: Final = 16
MMIOTNG_FLIGHT_RECORDING: Final = 1
MMIOTNG_FLIGHT_STOPPED: Final = 2
MMIOTNG_FLIGHT_CRASHED: Final = 3
MMIOTNG_FLIGHT_PANIC: Final = 1
MMIOTNG_FLIGHT_OOPS: Final = 2


class Op(IntEnum):
    """MMIOTNG_OP_*: what an access did."""

    READ = MMIOTNG_OP_READ
    WRITE = MMIOTNG_OP_WRITE
    UNKNOWN = MMIOTNG_OP_UNKNOWN


class AccessFlag(IntFlag):
    """MMIOTNG_F_*: mmiotng_access.flags bits."""

    SINGLESTEP = MMIOTNG_F_SINGLESTEP
    REP = MMIOTNG_F_REP
    USER = MMIOTNG_F_USER


class Mode(IntEnum):
    """MMIOTNG_MODE_*: values of the MMIOTNG_A_MODE attribute."""

    EMULATE = MMIOTNG_MODE_EMULATE
    SINGLESTEP = MMIOTNG_MODE_SINGLESTEP
    TRAP_ONLY = MMIOTNG_MODE_TRAP_ONLY


class MmiotngCmd(IntEnum):
    """enum mmiotng_cmd: generic-netlink commands (members keep the C names)."""

    MMIOTNG_CMD_UNSPEC = 0
    MMIOTNG_CMD_FILTER_ADD = 1
    MMIOTNG_CMD_FILTER_DEL = 2
    MMIOTNG_CMD_ARM_EXISTING = 3
    MMIOTNG_CMD_DISARM_ALL = 4
    MMIOTNG_CMD_STATUS = 5
    MMIOTNG_CMD_SET_MODE = 6
    MMIOTNG_CMD_NEW_DEVICES = 7
    MMIOTNG_CMD_FLIGHT_START = 8
    MMIOTNG_CMD_FLIGHT_READ = 9
    MMIOTNG_CMD_SYNC = 10
    MMIOTNG_CMD_TRACE_USER = 11
    MMIOTNG_CMD_ARM_USER = 12


class MmiotngAttr(IntEnum):
    """enum mmiotng_attr: generic-netlink attributes (members keep the C names)."""

    MMIOTNG_A_UNSPEC = 0
    MMIOTNG_A_PHYS = 1
    MMIOTNG_A_SIZE = 2
    MMIOTNG_A_VIRT = 3
    MMIOTNG_A_MODE = 4
    MMIOTNG_A_STAT_ARMED_PAGES = 5
    MMIOTNG_A_STAT_MAPPINGS = 6
    MMIOTNG_A_STAT_FILTERS = 7
    MMIOTNG_A_STAT_FAULTS = 8
    MMIOTNG_A_STAT_EMULATED = 9
    MMIOTNG_A_STAT_SINGLESTEPPED = 10
    MMIOTNG_A_STAT_UNKNOWN = 11
    MMIOTNG_A_STAT_OWNER = 12
    MMIOTNG_A_STAT_REFUSED = 13
    MMIOTNG_A_STAT_RETRIED = 14
    MMIOTNG_A_STAT_ABI_VERSION = 15
    MMIOTNG_A_STAT_STALE = 16
    MMIOTNG_A_STAT_PROBES_OFF = 17
    MMIOTNG_A_STAT_MISSED = 18
    MMIOTNG_A_STAT_SPARE_BYTES = 19
    MMIOTNG_A_RECS = 20
    MMIOTNG_A_OFFSET = 21
    MMIOTNG_A_TEXT = 22
    MMIOTNG_A_FLIGHT_DATA = 23
    MMIOTNG_A_STAT_FLIGHT_RECS = 24
    MMIOTNG_A_SYNC_NS = 25
    MMIOTNG_A_CPU = 26
    MMIOTNG_A_STAT_SYNC_LATE = 27
    MMIOTNG_A_PID = 28
    MMIOTNG_A_USER_PIDS = 29
    MMIOTNG_A_USER_COMMS = 30
    MMIOTNG_A_PAD = 31


# The C enums end with __MMIOTNG_*_MAX sentinels (not mirrored as members:
# Python would mangle a leading double underscore inside a class body).
MMIOTNG_CMD_MAX: Final = int(max(MmiotngCmd))
MMIOTNG_A_MAX: Final = int(max(MmiotngAttr))

# Netlink payload type of each attribute, for building the genl policy / nla_map.
ATTR_TYPES: Final[dict[MmiotngAttr, str]] = {
    MmiotngAttr.MMIOTNG_A_UNSPEC: "none",
    MmiotngAttr.MMIOTNG_A_PHYS: "uint64",
    MmiotngAttr.MMIOTNG_A_SIZE: "uint64",
    MmiotngAttr.MMIOTNG_A_VIRT: "uint64",
    MmiotngAttr.MMIOTNG_A_MODE: "uint32",
    MmiotngAttr.MMIOTNG_A_STAT_ARMED_PAGES: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_MAPPINGS: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_FILTERS: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_FAULTS: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_EMULATED: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_SINGLESTEPPED: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_UNKNOWN: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_OWNER: "uint32",
    MmiotngAttr.MMIOTNG_A_STAT_REFUSED: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_RETRIED: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_ABI_VERSION: "uint32",
    MmiotngAttr.MMIOTNG_A_STAT_STALE: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_PROBES_OFF: "uint32",
    MmiotngAttr.MMIOTNG_A_STAT_MISSED: "uint64",
    MmiotngAttr.MMIOTNG_A_STAT_SPARE_BYTES: "uint64",
    MmiotngAttr.MMIOTNG_A_RECS: "uint32",
    MmiotngAttr.MMIOTNG_A_OFFSET: "uint64",
    MmiotngAttr.MMIOTNG_A_TEXT: "asciiz",
    MmiotngAttr.MMIOTNG_A_FLIGHT_DATA: "cdata",
    MmiotngAttr.MMIOTNG_A_STAT_FLIGHT_RECS: "uint64",
    MmiotngAttr.MMIOTNG_A_SYNC_NS: "uint64",
    MmiotngAttr.MMIOTNG_A_CPU: "uint32",
    MmiotngAttr.MMIOTNG_A_STAT_SYNC_LATE: "uint64",
    MmiotngAttr.MMIOTNG_A_PID: "uint32",
    MmiotngAttr.MMIOTNG_A_USER_PIDS: "cdata",
    MmiotngAttr.MMIOTNG_A_USER_COMMS: "cdata",
    MmiotngAttr.MMIOTNG_A_PAD: "none",
}


class MmiotngAccess(ctypes.Structure):
    """struct mmiotng_access: the argument of the mmiotng_access tracepoint."""

    _fields_ = [
        ("map_virt", ctypes.c_uint64),
        ("phys", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("compat_value", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("width", ctypes.c_uint8),
        ("op", ctypes.c_uint8),
        ("compat_width", ctypes.c_uint8),
        ("compat_op", ctypes.c_uint8),
        ("insn_len", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("lost", ctypes.c_uint16),
        ("insn", ctypes.c_uint8 * MMIOTNG_INSN_BYTES),
        ("ts_ns", ctypes.c_uint64),
        ("map_phys", ctypes.c_uint64),
        ("map_len", ctypes.c_uint64),
    ]


class MmiotngMap(ctypes.Structure):
    """struct mmiotng_map: the argument of the mmiotng_map tracepoint."""

    _fields_ = [
        ("virt", ctypes.c_uint64),
        ("phys", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("err", ctypes.c_int32),
        ("pid", ctypes.c_uint32),
    ]


class MmiotngFlightHdr(ctypes.Structure):
    """struct mmiotng_flight_hdr: the start of the flight region."""

    _fields_ = [
        ("magic", ctypes.c_uint8 * 8),
        ("version", ctypes.c_uint32),
        ("state", ctypes.c_uint32),
        ("cpus", ctypes.c_uint32),
        ("recs", ctypes.c_uint32),
        ("rec_bytes", ctypes.c_uint32),
        ("maps", ctypes.c_uint32),
        ("maps_off", ctypes.c_uint64),
        ("recs_off", ctypes.c_uint64),
        ("start_ns", ctypes.c_uint64),
        ("start_real_ns", ctypes.c_uint64),
        ("crash_ns", ctypes.c_uint64),
        ("reason", ctypes.c_uint32),
        ("crash_cpu", ctypes.c_int32),
        ("panicked", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("message", ctypes.c_char * MMIOTNG_FLIGHT_MSG),
        ("text", ctypes.c_char * MMIOTNG_FLIGHT_TEXT),
    ]


class MmiotngFlightMap(ctypes.Structure):
    """struct mmiotng_flight_map: a mapping in the flight region's table."""

    _fields_ = [
        ("seq", ctypes.c_uint64),
        ("virt", ctypes.c_uint64),
        ("phys", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
    ]


class MmiotngFlightRec(ctypes.Structure):
    """struct mmiotng_flight_rec: an access in a CPU's flight ring."""

    _fields_ = [
        ("seq", ctypes.c_uint64),
        ("ts_ns", ctypes.c_uint64),
        ("map_virt", ctypes.c_uint64),
        ("phys", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("ip", ctypes.c_uint64),
        ("width", ctypes.c_uint8),
        ("op", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 5),
    ]


# C name -> mirror, for tests/unit/test_abi.py (every struct/enum of the header).
# Module constants named MMIOTNG_* are mirrors of the header's #defines/enum members.
C_PREFIX: Final = "MMIOTNG_"
C_STRUCTS: Final[dict[str, type[ctypes.Structure]]] = {
    "mmiotng_access": MmiotngAccess,
    "mmiotng_map": MmiotngMap,
    "mmiotng_flight_hdr": MmiotngFlightHdr,
    "mmiotng_flight_map": MmiotngFlightMap,
    "mmiotng_flight_rec": MmiotngFlightRec,
}
C_ENUMS: Final[dict[str, type[IntEnum]]] = {
    "mmiotng_cmd": MmiotngCmd,
    "mmiotng_attr": MmiotngAttr,
}
