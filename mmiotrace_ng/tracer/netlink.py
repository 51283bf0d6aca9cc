"""Generic-netlink client of the mmiotng helper module (pyroute2).

The family, commands and attributes come from mmiotrace_ng.format.abi, the mirror of
kmod/mmiotng_abi.h.  The socket that sends the first command owns the
helper's session: when it closes (normally or because the process died) the
helper disarms everything.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import platform
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple


def _enter_pyroute2_lightly() -> None:
    """Make `import pyroute2.netlink...` skip pyroute2's package __init__.

    That __init__ imports all of pyroute2's 160-odd modules (IPRoute, NDB,
    nftables, ...): 0.15 s here, but 10 s of mmiotrace-ng's start-up in a
    TCG guest, where only the generic-netlink core (16 modules) is needed.
    If nothing has imported pyroute2 yet, its package is registered without
    running __init__; a program that wants pyroute2's top-level names as
    well must import pyroute2 before this module."""
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the import below says so
    sys.modules["pyroute2"] = importlib.util.module_from_spec(spec)


class _Uname(NamedTuple):
    """platform.uname()'s fields, the processor given."""

    system: str
    node: str
    release: str
    version: str
    machine: str
    processor: str


@contextlib.contextmanager
def _platform_without_subprocesses() -> Iterator[None]:
    """pyroute2.config asks at its import for tuple(platform.uname()) and
    platform.architecture(), which on Linux run `uname -p` and `file -b
    PYTHON` as child processes: milliseconds on hardware, 4-5 s of every
    start in a TCG guest.  While it imports, the same answers come from
    os.uname() and the interpreter's pointer size (the processor as
    platform gives it where `uname -p` says "unknown": blank)."""
    saved = platform.uname, platform.architecture
    u = os.uname()
    bits = f"{struct.calcsize('P') * 8}bit"
    known = _Uname(u.sysname, u.nodename, u.release, u.version, u.machine, "")
    platform.uname = lambda: known  # type: ignore[assignment]
    platform.architecture = lambda *_a, **_k: (bits, "ELF")  # type: ignore[assignment]
    try:
        yield
    finally:
        platform.uname, platform.architecture = saved


_enter_pyroute2_lightly()

with _platform_without_subprocesses():
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST, genlmsg
    from pyroute2.netlink.exceptions import NetlinkError
    from pyroute2.netlink.generic import GenericNetlinkSocket

from ..format.abi import (  # noqa: E402
    ATTR_TYPES,
    MMIOTNG_COMM_LEN,
    MMIOTNG_GENL_NAME,
    MMIOTNG_GENL_VERSION,
    MmiotngAttr,
    MmiotngCmd,
)


class ngmsg(genlmsg):  # noqa: N801 (pyroute2's naming)
    """A message of the mmiotrace_ng family; attribute names are the C names."""

    nla_map = tuple((a.name, ATTR_TYPES[a]) for a in sorted(MmiotngAttr))


class HelperError(Exception):
    """A command failed; errno and the helper's own message, if it gave one."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.errno = code


class Status(NamedTuple):
    armed_pages: int
    mappings: int
    filters: int
    faults: int
    emulated: int
    singlestepped: int
    unknown: int
    owner: int
    refused: int
    retried: int
    abi_version: int   # 0: a module older than the attribute
    stale: int         # armed entries an unseen iounmap changed, left alone
    probes_off: int    # 1: kprobes are disabled, the helper traces nothing
    missed: int        # ioremap/iounmap calls its probes missed (said in the trace)
    spare_bytes: int   # bytes the mappings kept ready for new ioremaps take
    flight_recs: int = 0   # flight records kept per CPU (0: the flight recorder is off)
    sync_late: int = 0     # --sync: accesses that waited for their record in vain (1 s)


class HelperSocket:
    """One controlling connection to the helper module."""

    def __init__(self) -> None:
        self.sock = GenericNetlinkSocket()
        try:
            self.sock.bind(MMIOTNG_GENL_NAME, ngmsg)
        except NetlinkError as exc:
            self.sock.close()
            raise HelperError(exc.code, "the mmiotng helper module is not loaded") from exc

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> HelperSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, cmd: MmiotngCmd, attrs: Mapping[str, int | bytes]) -> list:
        msg = ngmsg()
        msg["cmd"] = int(cmd)
        msg["version"] = MMIOTNG_GENL_VERSION
        msg["attrs"] = [[k, v] for k, v in attrs.items()]
        try:
            return self.sock.nlm_request(msg, msg_type=self.sock.prid,
                                         msg_flags=NLM_F_REQUEST | NLM_F_ACK)
        except NetlinkError as exc:
            text = exc.args[1] if len(exc.args) > 1 and exc.args[1] else errno.errorcode.get(
                exc.code, str(exc.code))
            raise HelperError(exc.code, f"{cmd.name}: {text}") from exc

    def filter_add(self, phys: int, size: int) -> None:
        self._request(MmiotngCmd.MMIOTNG_CMD_FILTER_ADD,
                      {"MMIOTNG_A_PHYS": phys, "MMIOTNG_A_SIZE": size})

    def filter_del(self, phys: int, size: int) -> None:
        self._request(MmiotngCmd.MMIOTNG_CMD_FILTER_DEL,
                      {"MMIOTNG_A_PHYS": phys, "MMIOTNG_A_SIZE": size})

    def arm_existing(self, virt: int, size: int, phys: int) -> None:
        self._request(MmiotngCmd.MMIOTNG_CMD_ARM_EXISTING,
                      {"MMIOTNG_A_VIRT": virt, "MMIOTNG_A_SIZE": size,
                       "MMIOTNG_A_PHYS": phys})

    def trace_user(self, pids: Sequence[int] = (), comms: Sequence[str] = ()) -> None:
        """Trace the traced pages processes map from now on (remap_pfn_range),
        of those processes (ids, names: a thread's or its process's) only if
        any is given."""
        attrs: dict[str, int | bytes] = {}
        if pids:
            attrs["MMIOTNG_A_USER_PIDS"] = struct.pack(f"={len(pids)}I", *pids)
        if comms:
            attrs["MMIOTNG_A_USER_COMMS"] = b"".join(
                c.encode()[:MMIOTNG_COMM_LEN - 1].ljust(MMIOTNG_COMM_LEN, b"\0") for c in comms)
        self._request(MmiotngCmd.MMIOTNG_CMD_TRACE_USER, attrs)

    def arm_user(self, pid: int, virt: int, size: int) -> None:
        """Trace process pid's mapping [virt, virt + size), made before trace_user()."""
        self._request(MmiotngCmd.MMIOTNG_CMD_ARM_USER,
                      {"MMIOTNG_A_PID": pid, "MMIOTNG_A_VIRT": virt, "MMIOTNG_A_SIZE": size})

    def disarm_all(self) -> None:
        self._request(MmiotngCmd.MMIOTNG_CMD_DISARM_ALL, {})

    def set_mode(self, mode: int) -> None:
        self._request(MmiotngCmd.MMIOTNG_CMD_SET_MODE, {"MMIOTNG_A_MODE": mode})

    def trace_new_devices(self) -> None:
        """Trace every PCI device a driver binds to from now on (--all)."""
        self._request(MmiotngCmd.MMIOTNG_CMD_NEW_DEVICES, {})

    def flight_start(self, phys: int, size: int, recs: int, text: str) -> None:
        """Keep the last recs accesses of each CPU in that reserved memory."""
        self._request(MmiotngCmd.MMIOTNG_CMD_FLIGHT_START,
                      {"MMIOTNG_A_PHYS": phys, "MMIOTNG_A_SIZE": size,
                       "MMIOTNG_A_RECS": recs, "MMIOTNG_A_TEXT": text})

    def flight_read(self, phys: int, size: int, offset: int) -> bytes:
        """Bytes of the flight region from offset (at most MMIOTNG_FLIGHT_READ_MAX)."""
        reply = self._request(MmiotngCmd.MMIOTNG_CMD_FLIGHT_READ,
                              {"MMIOTNG_A_PHYS": phys, "MMIOTNG_A_SIZE": size,
                               "MMIOTNG_A_OFFSET": offset})
        msg = next(m for m in reply if m.get("cmd") == MmiotngCmd.MMIOTNG_CMD_FLIGHT_READ)
        return bytes(msg.get_attr("MMIOTNG_A_FLIGHT_DATA") or b"")

    def sync_ack(self, cpu: int, ts_ns: int) -> None:
        """--sync: every record of cpu stamped up to ts_ns is written (the
        first call turns the waiting on)."""
        self._request(MmiotngCmd.MMIOTNG_CMD_SYNC,
                      {"MMIOTNG_A_CPU": cpu, "MMIOTNG_A_SYNC_NS": ts_ns})

    def status(self) -> Status:
        reply = self._request(MmiotngCmd.MMIOTNG_CMD_STATUS, {})
        msg = next(m for m in reply if m.get("cmd") == MmiotngCmd.MMIOTNG_CMD_STATUS)

        def get(name: str) -> int:
            return int(msg.get_attr("MMIOTNG_A_STAT_" + name) or 0)

        return Status(get("ARMED_PAGES"), get("MAPPINGS"), get("FILTERS"), get("FAULTS"),
                      get("EMULATED"), get("SINGLESTEPPED"), get("UNKNOWN"), get("OWNER"),
                      get("REFUSED"), get("RETRIED"), get("ABI_VERSION"), get("STALE"),
                      get("PROBES_OFF"), get("MISSED"), get("SPARE_BYTES"),
                      get("FLIGHT_RECS"), get("SYNC_LATE"))
