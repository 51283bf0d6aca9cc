"""Host tests for vagrant/Vagrantfile (the guest suite in a Vagrant box).

* ``vagrant validate --ignore-provider``: the Vagrantfile loads and its
  general settings (box, synced folder, shell provisioners) are valid.
  Needs only the ``vagrant`` command (Debian 12: package ``vagrant``).
* ``vagrant validate`` with the libvirt provider: the libvirt block
  (qemuargs, memory, cpus, driver, NIC model) too.  Needs the vagrant-libvirt
  plugin (Debian 12: package ``vagrant-libvirt``; no libvirt daemon needed).
  Without any provider plugin, Debian 12's vagrant 2.3.4 refuses a plain
  ``vagrant validate`` ("No usable default provider could be found"), which
  is why the first test ignores the provider.
* The Vagrantfile stays in step with tests/run: same setup script, same QEMU
  devices, same kernel command line, same guest pytest.

When vagrant or the plugin is missing, the test fails if the environment
variable CI is set (CI must install them) and is skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ng_require import required

ROOT = Path(__file__).resolve().parents[2]
VAGRANT_DIR = ROOT / "vagrant"
VAGRANTFILE = VAGRANT_DIR / "Vagrantfile"
IN_CI = required()


def _missing(what: str) -> None:
    msg = (f"{what} is not installed (Debian 12: apt-get install --no-install-recommends "
           "vagrant vagrant-libvirt)")
    if IN_CI:
        pytest.fail(f"{msg}; CI is set, so it must be there (tests/setup.sh installs it)",
                    pytrace=False)
    pytest.skip(msg)


def _vagrant(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    if shutil.which("vagrant") is None:
        _missing("the vagrant command")
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("NGVM_")}
    run_env.update(
        # keep .vagrant/ (machine state) out of the checkout
        VAGRANT_DOTFILE_PATH=str(tmp_path / "dotvagrant"),
        VAGRANT_CHECKPOINT_DISABLE="1",
        **env,
    )
    return subprocess.run(["vagrant", *args, "--no-color"], cwd=VAGRANT_DIR, env=run_env,
                          capture_output=True, text=True, timeout=300, check=False)


def _assert_ok(res: subprocess.CompletedProcess, what: str) -> None:
    assert res.returncode == 0, (f"{what} exited {res.returncode}:\n"
                                 f"{res.stdout}\n{res.stderr}")
    assert "Vagrantfile validated successfully" in res.stdout, res.stdout


def test_vagrant_validate_ignore_provider(tmp_path):
    res = _vagrant(["validate", "--ignore-provider"], tmp_path)
    _assert_ok(res, "vagrant validate --ignore-provider")


def test_vagrant_validate_libvirt(tmp_path):
    plugins = _vagrant(["plugin", "list"], tmp_path)
    assert plugins.returncode == 0, plugins.stderr
    if "vagrant-libvirt" not in plugins.stdout:
        _missing("the vagrant-libvirt plugin")
    res = _vagrant(["validate"], tmp_path, VAGRANT_DEFAULT_PROVIDER="libvirt")
    _assert_ok(res, "vagrant validate (libvirt provider)")


def test_vagrantfile_in_step_with_tests_run():
    vf = VAGRANTFILE.read_text()
    run = (ROOT / "tests" / "run").read_text()
    # the one setup script, not a copy of it
    assert "#{SRC}/tests/setup.sh" in vf
    assert "tests/setup.sh" in run
    # the devices and the kernel command line the guest tests expect
    assert "--qemu '-device edu'" in run
    assert 'libvirt.qemuargs value: "edu"' in vf
    assert "-device e1000,netdev=n0" in run
    assert 'libvirt.qemuargs value: "e1000,netdev=n0"' in vf
    for dev in ("i6300esb", "sdhci-pci"):
        assert f"--qemu '-device {dev}'" in run
        assert f'libvirt.qemuargs value: "{dev}"' in vf
    for n, size in ((0, "64M"), (1, "1G")):
        backend = f"memory-backend-memfd,id=iv{n},size={size}"
        assert f"-object {backend} -device ivshmem-plain,memdev=iv{n}" in run
        assert f'libvirt.qemuargs value: "{backend}"' in vf
        assert f'libvirt.qemuargs value: "ivshmem-plain,memdev=iv{n}"' in vf
    assert "--append 'modprobe.blacklist=e1000,i6300esb,sdhci_pci'" in run
    assert "modprobe.blacklist=e1000,i6300esb,sdhci_pci" in vf
    # the same guest suite, with the switch that un-skips it
    assert "pytest -v -p no:cacheprovider --durations=25 -m 'not single_tcg' tests/guest" in run
    assert "--accel tcg-single" in run and "-m single_tcg tests/guest" in run
    assert "NGVM_GUEST=1" in vf and "NGVM_ACCEL=#{NGVM_ACCEL}" in vf
    assert ('.venv/bin/python -m pytest -v -p no:cacheprovider --durations=25 '
            '${sel:+-m "$sel"} tests/guest'
            in vf)
    assert '[ "$NGVM_ACCEL" = tcg-multi ] && sel="not single_tcg"' in vf
