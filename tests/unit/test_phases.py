"""phases: --verbose's start-up times."""

from __future__ import annotations

import re
import time

from mmiotrace_ng.common.phases import Phases, process_start


def test_phases_print_once_enabled_with_those_seen_before(capsys) -> None:
    p = Phases()
    p.done("imports")
    assert capsys.readouterr().err == ""
    time.sleep(0.05)
    p.enable()
    p.done("later")
    lines = capsys.readouterr().err.splitlines()
    pat = re.compile(r"^mmiotrace-ng: +([\d.]+) s \(\+ *([\d.]+) s\) (.*)$")
    got = [pat.match(ln).groups() for ln in lines]
    assert [g[2] for g in got] == ["imports", "later"]
    # each line's time is the sum of the phases up to it
    assert abs(float(got[1][0]) - float(got[0][1]) - float(got[1][1])) <= 0.011
    assert float(got[1][1]) >= 0.04


def test_the_process_start_is_before_now() -> None:
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert now - 3600 < process_start() <= now
