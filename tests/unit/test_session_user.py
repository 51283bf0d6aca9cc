"""A process's mappings of the traced ranges: traced when the helper can
(TRACE_USER), said otherwise (the kprobe on remap_pfn_range), with why; a
mapping held before the start that the helper refuses is said too."""

from __future__ import annotations

import argparse
import errno
import io

import pytest

from mmiotrace_ng.common.errors import UsageError
from mmiotrace_ng.tracer.netlink import HelperError
from mmiotrace_ng.tracer.session import NO_NUMA_BALANCING, Session


class FakeHelper:
    def __init__(self, refuse: int = 0, refuse_arm: int = 0) -> None:
        self.refuse, self.refuse_arm = refuse, refuse_arm
        self.armed: list[tuple[int, int, int]] = []

    def trace_user(self, pids: list[int], comms: list[str]) -> None:
        if self.refuse:
            raise HelperError(self.refuse, "MMIOTNG_CMD_TRACE_USER: refused")
        self.filter = (pids, comms)

    def arm_user(self, pid: int, virt: int, size: int) -> None:
        if self.refuse_arm:
            raise HelperError(self.refuse_arm, "MMIOTNG_CMD_ARM_USER: refused")
        self.armed.append((pid, virt, size))


class FakeProbes:
    def __init__(self) -> None:
        self.said: list[list[tuple[int, int]]] = []
        self.unmaps = False

    def report_user_maps(self, ranges: list[tuple[int, int]]) -> list[str]:
        self.said.append(ranges)
        return []

    def trace_user_unmaps(self) -> list[str]:
        self.unmaps = True
        return []


def session(helper: FakeHelper, user: list[str] | None = None) -> tuple[Session, FakeProbes]:
    args = argparse.Namespace(compat=False, pc=False, pid=False, histogram=False, irq=False,
                              dma=False, user_pids=[int(u) for u in user or [] if u.isdigit()],
                              user_names=[u for u in user or [] if not u.isdigit()])
    s = Session(args, io.BytesIO())
    s.helper = helper           # type: ignore[assignment]
    probes = FakeProbes()
    s.probes = probes           # type: ignore[assignment]
    return s, probes


RANGES = [(0xFEA00000, 0xFEB00000)]


def test_traced_when_the_helper_can(capsys):
    s, probes = session(FakeHelper())
    assert s.trace_user(RANGES) is True
    assert probes.said == [] and capsys.readouterr().err == ""
    assert probes.unmaps


def test_user_names_the_processes_the_helper_traces():
    helper = FakeHelper()
    s, _ = session(helper, ["1234", "vfio-app", "42"])
    assert s.trace_user(RANGES) is True
    assert helper.filter == ([1234, 42], ["vfio-app"])
    helper = FakeHelper()
    s, _ = session(helper)
    assert s.trace_user(RANGES) is True and helper.filter == ([], [])


def test_a_user_process_gone_at_the_start_is_a_usage_error():
    s, probes = session(FakeHelper(refuse=errno.ESRCH), ["1234"])
    with pytest.raises(UsageError, match="--user: a process of 1234 is gone"):
        s.trace_user(RANGES)
    assert probes.said == []


def test_said_without_numa_balancing_with_why(capsys):
    s, probes = session(FakeHelper(refuse=errno.EOPNOTSUPP))
    assert s.trace_user(RANGES) is False
    assert probes.said == [RANGES]
    assert capsys.readouterr().err == (
        "mmiotrace-ng: mappings of the traced ranges into processes are said, NOT traced: "
        f"{NO_NUMA_BALANCING}\n")


def test_a_held_mapping_the_helper_refuses_is_said_one_of_a_gone_process_not(capsys):
    s, _ = session(FakeHelper(refuse_arm=errno.EINVAL))
    assert s.arm_user(42, 0x7F0000000000, 0xFEA00000, 0x1000) is False
    assert "process 42's mapping at 0x7f0000000000 is NOT traced" in capsys.readouterr().err
    s, _ = session(FakeHelper(refuse_arm=errno.ESRCH))
    assert s.arm_user(42, 0x7F0000000000, 0xFEA00000, 0x1000) is True
    # not one of the processes --user names: nothing to say either
    s, _ = session(FakeHelper(refuse_arm=errno.ENOENT))
    assert s.arm_user(42, 0x7F0000000000, 0xFEA00000, 0x1000) is True
    assert capsys.readouterr().err == ""
    helper = FakeHelper()
    s, _ = session(helper)
    assert s.arm_user(42, 0x7F0000000000, 0xFEA00000, 0x1000) is True
    assert helper.armed == [(42, 0x7F0000000000, 0x1000)]
