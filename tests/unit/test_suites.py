"""The release roots of tests/run --suite (tests/vm/suites.py): what they
hold, when they are made again, and how a command runs inside one."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "vm"))
import suites  # noqa: E402


def test_each_root_has_the_tools_own_dependencies_and_its_kernels_headers():
    for suite in suites.SUITES.values():
        pkgs = suite.packages()
        for dep in ("python3-bpfcc", "python3-pyroute2", "python3-pytest", "build-essential"):
            assert dep in pkgs, (suite.name, dep)
        images = [p for p in pkgs if p.startswith("linux-image-")]
        assert f"linux-image-{suite.default}" in images
        for image in suite.kernels:
            assert image.replace("linux-image-", "linux-headers-", 1) in pkgs
        # an image whose headers are not in the index brings them from the pool
        for image in suite.pool_kernels:
            ver = image[len("linux-image-"):]
            assert any(Path(d).name.startswith(f"linux-headers-{ver}_")
                       for d in suite.pool_debs), image


def test_the_cache_key_follows_the_package_list():
    suite = suites.SUITES["sid"]
    same = dataclasses.replace(suite)
    more = dataclasses.replace(suite, kernels=(*suite.kernels, "linux-image-9.9.9-amd64"))
    assert same.key() == suite.key()
    assert more.key() != suite.key()
    assert suites.root_dir(more) != suites.root_dir(suite)


def test_a_command_runs_in_the_checkout_inside_the_root_in_its_own_mounts(tmp_path):
    cmd = suites.chroot_cmd(tmp_path / "root", Path("/work/x y"), "make -C kmod",
                            {"KVER": "7.2"})
    assert cmd[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = cmd[-1]
    root = shlex.quote(str(tmp_path / "root"))
    assert script.startswith(f"set -e; mount --bind {root} {root}; ")
    assert f"mount --bind '/work/x y' {root}'/work/x y'" in script
    inner = shlex.split(script.split("exec chroot ", 1)[1])
    assert inner[:3] == [str(tmp_path / "root"), "/bin/sh", "-c"]
    assert "export KVER=7.2; cd '/work/x y' && make -C kmod" in inner[3]
    assert "PYTHONPATH='/work/x y'" in inner[3]
