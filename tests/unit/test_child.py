"""-- CMD ARGS: the command's exit status, 128 + N for signal N, and one
clear error for a command that cannot run."""

from __future__ import annotations

import time

import pytest

from mmiotrace_ng.common.child import ended, start
from mmiotrace_ng.common.errors import UsageError


def wait(child) -> int:
    deadline = time.monotonic() + 30
    while (status := ended(child)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return status


def test_exit_status_and_signals():
    assert start([]) is None and ended(None) is None
    assert wait(start(["sh", "-c", "exit 3"])) == 3
    assert wait(start(["sh", "-c", "kill -TERM $$"])) == 128 + 15
    running = start(["sleep", "5"])
    assert ended(running) is None
    running.kill()
    assert wait(running) == 128 + 9


def test_a_command_that_cannot_run():
    with pytest.raises(UsageError, match="cannot run /no/such/cmd: No such file"):
        start(["/no/such/cmd"])
