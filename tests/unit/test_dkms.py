"""`mmiotrace-ng install-helper --kernel KVER` of the installed tool, with the
real DKMS, for the kernel the test guest boots (KVER: tests/run passes it
in MMIOTNG_KVER; tests/default-kernel otherwise).  It runs here, in a
private mount namespace whose /usr/src, /var/lib/dkms and /lib/modules/KVER
are overlays on tmpfs, so the host keeps none of it: a build for a kernel
that is not running is what DKMS does for every new kernel, and under TCG
the same build takes minutes.  What DKMS wrote (the overlays' upper layers)
is kept in tests/artifacts/dkms: the guest test puts it over the same
directories of that kernel's boot and traces with the helper modprobe finds
there (tests/guest/test_install.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ng_require import guest_kernel, missing

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / "tests" / "artifacts" / "installed"
OUT = REPO / "tests" / "artifacts" / "dkms"
# the directories DKMS writes, in the order of OUT's numbered upper layers
DKMS_DIRS = ("/usr/src", "/var/lib/dkms", "/lib/modules/{kver}")

SCRIPT = r"""
set -eu
n=0
for d in "$@"; do
    b=$WORK/layer$n
    mkdir -p "$b"
    mount -t tmpfs tmpfs "$b"
    mkdir "$b/upper" "$b/work"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$b/upper,workdir=$b/work" "$d"
    n=$((n + 1))
done
cd /
"$NG" install-helper --kernel "$KVER" 2>"$WORK/stderr"
dkms status mmiotng >"$WORK/status"
modinfo -k "$KVER" -n mmiotng >"$WORK/path"
n=0
for d in "$@"; do
    cp -a "$WORK/layer$n/upper" "$WORK/upper$n"
    n=$((n + 1))
done
"""


@pytest.fixture(scope="module")
def installed_with_dkms(tmp_path_factory) -> tuple[str, Path]:
    kver = guest_kernel()
    ng = VENV / "bin" / "mmiotrace-ng"
    if os.geteuid() != 0:
        missing("needs root (a private mount namespace and DKMS)")
    if not shutil.which("dkms") or not shutil.which("unshare"):
        missing("no dkms or unshare (apt-get install dkms)")
    if not Path(f"/lib/modules/{kver}/build").is_dir():
        missing(f"no headers for {kver}")
    if not ng.exists():
        missing(f"no {ng}: tests/setup.sh installs the wheel there")
    work = tmp_path_factory.mktemp("dkms")
    dirs = [d.format(kver=kver) for d in DKMS_DIRS]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(WORK=str(work), NG=str(ng), KVER=kver,
               PATH=f"{VENV / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin")
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          SCRIPT, "sh", *dirs], env=env, capture_output=True, text=True,
                         timeout=900)
    stderr = (work / "stderr").read_text() if (work / "stderr").exists() else ""
    assert res.returncode == 0, res.stdout + res.stderr + stderr
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    for n in range(len(dirs)):
        subprocess.run(["cp", "-a", str(work / f"upper{n}"), str(OUT / f"upper{n}")], check=True)
    (OUT / "kernel").write_text(kver + "\n")
    return kver, work


def test_install_helper_installs_with_dkms_for_the_kernel(installed_with_dkms):
    kver, work = installed_with_dkms
    stderr = (work / "stderr").read_text()
    assert f"installed for {kver} " in stderr, stderr
    assert re.search(rf"^mmiotng/\S+, {re.escape(kver)}, x86_64: installed",
                     (work / "status").read_text(), re.M), (work / "status").read_text()
    ko = (work / "path").read_text().strip()
    assert ko.startswith(f"/lib/modules/{kver}/updates/dkms/mmiotng.ko"), ko
    # what the guest needs: the module and the modules.dep that lists it
    upper = OUT / "upper2"
    assert (upper / ko.removeprefix(f"/lib/modules/{kver}/")).is_file()
    assert "updates/dkms/mmiotng.ko" in (upper / "modules.dep").read_text()
    # the BPF programs are only compiled ahead for the running kernel
    if kver != os.uname().release:
        assert "BPF programs are compiled" not in stderr, stderr


def test_the_host_keeps_nothing(installed_with_dkms):
    kver, _ = installed_with_dkms
    assert not list(Path("/usr/src").glob("mmiotng-*"))
    assert not Path("/var/lib/dkms/mmiotng").exists()
    assert not Path(f"/lib/modules/{kver}/updates/dkms/mmiotng.ko").exists()
