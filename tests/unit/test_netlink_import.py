"""mmiotrace_ng.tracer.netlink loads only pyroute2's netlink core, and does not get
in the way of a program that imported all of pyroute2 first."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyroute2")


def run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


COUNT = "import sys; print(sum(m.split('.')[0] == 'pyroute2' for m in sys.modules))"


def test_netlink_skips_pyroute2_package_init() -> None:
    light = int(run("import mmiotrace_ng.tracer.netlink as n; n.HelperSocket, n.NetlinkError\n"
                    + COUNT))
    full = int(run("import pyroute2.netlink.generic\n" + COUNT))
    assert 0 < light < 40 < full, (light, full)


def test_full_pyroute2_imported_first_still_works() -> None:
    out = run("import pyroute2\nimport mmiotrace_ng.tracer.netlink\n"
              "print(pyroute2.IPRoute.__name__, pyroute2.netlink.generic.__name__)")
    assert out == "IPRoute pyroute2.netlink.generic"
