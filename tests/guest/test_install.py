"""The tool as users install it: the wheel built from this repository,
installed by pip into a fresh venv (tests/setup.sh makes both, in
tests/artifacts/dist and tests/artifacts/installed) and run from /, with
nothing of the checkout on its path, the helper module either
built on first use from the sources the wheel ships (on the host, for this
kernel: tests/unit/test_helper_build.py) or installed with DKMS by
`mmiotrace-ng install-helper --kernel` (on the host too:
tests/unit/test_dkms.py)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXERCISER_DEBUGFS
from ng_tracer import REPO

DIST = REPO / "tests" / "artifacts" / "dist"
VENV = REPO / "tests" / "artifacts" / "installed"
DKMS_OUT = REPO / "tests" / "artifacts" / "dkms"
HELPER_BUILD = REPO / "tests" / "artifacts" / "helper-build"
RELEASE = os.uname().release


def rmmod_helper() -> None:
    if Path("/sys/module/mmiotng").exists():
        subprocess.run(["rmmod", "mmiotng"], check=True, timeout=120)


@pytest.fixture(scope="module")
def installed() -> dict[str, str]:
    """The venv tests/setup.sh installed the wheel into; the environment to
    run its console script in, with nothing of the checkout on the path."""
    if not sorted(DIST.glob("mmiotrace_ng-*.whl")) or not (VENV / "bin" / "mmiotrace-ng").exists():
        pytest.fail(f"no wheel in {DIST} or no venv {VENV}: tests/setup.sh makes them",
                    pytrace=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{VENV / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"
    where = subprocess.run([str(VENV / "bin" / "python"), "-c",
                            "import mmiotrace_ng; print(mmiotrace_ng.__file__)"],
                           cwd="/", env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(f"{VENV}/lib/"), where.stdout
    return env


@pytest.fixture
def no_helper():
    """No helper loaded during the test; the checkout's one afterwards."""
    rmmod_helper()
    yield
    rmmod_helper()
    subprocess.run(["insmod", str(REPO / "kmod" / "mmiotng.ko")], check=True)


def trace_readl(env: dict[str, str], dev: str, *options: str
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mmiotrace-ng", *options, "--pci", dev, "--", "sh", "-c",
                           f"echo readl > {EXERCISER_DEBUGFS / 'run'}"],
                          cwd="/", env=env, capture_output=True, text=True, timeout=1200)


def assert_traced_readl(res: subprocess.CompletedProcess[str], exerciser) -> None:
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("VERSION 20070824\n")
    reads = re.findall(rf"^R 4 \S+ \d+ 0x{exerciser.bar0[0]:x} 0x10000ed ", res.stdout, re.M)
    assert len(reads) == 1, res.stdout


def test_installed_wheel_traces_with_a_helper_built_on_first_use(installed, exerciser,
                                                                  no_helper, tmp_path):
    """The helper the installed tool built on its first use for this kernel
    (on the host, by tests/unit/test_helper_build.py: the same build, in
    seconds rather than minutes) is what a later run loads: nothing is
    built, and the module loaded is that build."""
    kept = HELPER_BUILD.with_name("helper-build.kernel")
    if not kept.exists() or kept.read_text().strip() != RELEASE:
        pytest.fail(f"{HELPER_BUILD} holds no helper built for {RELEASE}: the host test "
                    "tests/unit/test_helper_build.py builds it", pytrace=False)
    # no other helper for it to find: none installed (modprobe), and the
    # checkout's build is not the installed tool's to see
    assert subprocess.run(["modinfo", "-n", "mmiotng"], capture_output=True).returncode != 0
    build = tmp_path / "helper-build"
    subprocess.run(["cp", "-a", str(HELPER_BUILD), str(build)], check=True)
    env = dict(installed, MMIOTNG_BUILD_DIR=str(build))
    res = trace_readl(env, exerciser.dev.name, "--verbose")
    assert_traced_readl(res, exerciser)
    assert "building" not in res.stderr, res.stderr
    assert f" loading the helper module {build / 'mmiotng.ko'}\n" in res.stderr, res.stderr


@contextlib.contextmanager
def dkms_installed(tmp: Path) -> Iterator[None]:
    """What `mmiotrace-ng install-helper --kernel RELEASE` had DKMS write on
    the host (tests/unit/test_dkms.py keeps it in tests/artifacts/dkms), put
    over the same directories of this boot (the host's, shared read-only) as
    overlays whose upper layers are tmpfs copies of it."""
    kept = (DKMS_OUT / "kernel").read_text().strip() if (DKMS_OUT / "kernel").exists() else None
    if kept != RELEASE:
        pytest.fail(f"{DKMS_OUT} holds no DKMS install for {RELEASE} (it holds {kept}): "
                    "the host test tests/unit/test_dkms.py makes it", pytrace=False)
    subprocess.run(["modprobe", "overlay"], check=True)
    mounted: list[str] = []
    try:
        for n, d in enumerate(("/usr/src", "/var/lib/dkms", f"/lib/modules/{RELEASE}")):
            base = tmp / f"overlay{n}"
            base.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(base)], check=True)
            mounted.append(str(base))
            subprocess.run(["cp", "-a", str(DKMS_OUT / f"upper{n}"), str(base / "upper")],
                           check=True)
            (base / "work").mkdir()
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={d},upperdir={base}/upper,workdir={base}/work", d],
                           check=True)
            mounted.append(d)
        yield
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", m], check=False)


def test_installed_wheel_traces_with_the_helper_from_dkms(installed, exerciser, no_helper,
                                                          tmp_path):
    """With the helper that `mmiotrace-ng install-helper` installed with
    DKMS for this kernel, a plain run loads that module (modprobe) and builds
    nothing: its stderr is the three lines."""
    env = dict(installed, MMIOTNG_BUILD_DIR=str(tmp_path / "never-built"))
    with dkms_installed(tmp_path):
        status = subprocess.run(["dkms", "status", "mmiotng"], capture_output=True, text=True)
        assert re.search(rf"^mmiotng/\S+, {re.escape(RELEASE)}, x86_64: installed",
                         status.stdout, re.M), status.stdout
        ko = subprocess.run(["modinfo", "-n", "mmiotng"], capture_output=True, text=True,
                            check=True).stdout.strip()
        assert ko.startswith(f"/lib/modules/{RELEASE}/updates/dkms/"), ko
        # signed with DKMS's own key, whose certificate the README has the
        # user enroll (mokutil --import /var/lib/dkms/mok.pub) for Secure Boot
        signer = subprocess.run(["modinfo", "-F", "signer", "mmiotng"], capture_output=True,
                                text=True, check=True).stdout.strip()
        subject = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-subject",
                                  "-in", "/var/lib/dkms/mok.pub"], capture_output=True,
                                 text=True, check=True).stdout
        # "subject=CN = NAME" (OpenSSL 3.0) or "subject=CN=NAME" (3.5)
        cn = re.search(r"CN\s*=\s*(.+)$", subject.strip())
        assert signer and cn and cn[1] == signer, (signer, subject)
        res = trace_readl(env, exerciser.dev.name)
        assert_traced_readl(res, exerciser)
        lines = res.stderr.splitlines()
        assert len(lines) == 3 and "building" not in res.stderr, res.stderr
        assert not (tmp_path / "never-built").exists()    # the module modprobe found
        assert Path("/sys/module/mmiotng").exists()
        rmmod_helper()


def test_checkout_traces_with_the_distributions_own_packages(exerciser):
    """No venv and no pip: the distribution's python3, its python3-bpfcc and
    python3-pyroute2 (Debian 12: 0.7.2; a release's root under tests/run
    --suite: that release's), and the checkout on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    deb = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "python3-pyroute2"],
                         capture_output=True, text=True, check=True).stdout
    used = subprocess.run(["/usr/bin/python3", "-c", "import importlib.metadata as m, pyroute2; "
                           "print(m.version('pyroute2'), pyroute2.__file__)"],
                          cwd="/", env=env, capture_output=True, text=True, check=True).stdout
    assert used.startswith(deb.split("-")[0] + " /usr/lib/python3/dist-packages/"), (deb, used)
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(["/usr/bin/python3", "-m", "mmiotrace_ng", "--pci",
                          exerciser.dev.name, "--", "sh", "-c",
                          f"echo readl > {EXERCISER_DEBUGFS / 'run'}"],
                         cwd="/", env=env, capture_output=True, text=True, timeout=1200)
    assert_traced_readl(res, exerciser)
