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
* vagrant/make-box (the box built from Debian's packages, for runners that
  cannot download the public one, or whose box has no network) installs
  every Debian package tests/setup.sh installs, so that setup.sh runs no
  apt-get in that box, and puts its wheelhouse where the Vagrantfile looks.

When vagrant or the plugin is missing, the test fails if the environment
variable CI is set (CI must install them) and is skipped otherwise.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression
from ng_require import required

ROOT = Path(__file__).resolve().parents[2]
VAGRANT_DIR = ROOT / "vagrant"
VAGRANTFILE = VAGRANT_DIR / "Vagrantfile"
MAKE_BOX = VAGRANT_DIR / "make-box"
SETUP_SH = ROOT / "tests" / "setup.sh"
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


def _has_qemu_device(vf: str, device: str) -> bool:
    """The Vagrantfile adds `-device DEVICE` (at a fixed slot, ",addr=0xNN")."""
    return re.search(rf'libvirt\.qemuargs value: "{re.escape(device)}(,addr=0x[0-9a-f]+)?"\n',
                     vf) is not None


def test_vagrantfile_in_step_with_tests_run():
    vf = VAGRANTFILE.read_text()
    run = (ROOT / "tests" / "run").read_text()
    # the machine tests/vm/run boots
    assert '"-machine", "q35"' in (ROOT / "tests" / "vm" / "run").read_text()
    assert 'libvirt.machine_type = "q35"' in vf
    # the one setup script, not a copy of it
    assert "#{SRC}/tests/setup.sh" in vf
    assert "tests/setup.sh" in run
    # the devices and the kernel command line the guest tests expect
    assert "--qemu '-device edu'" in run
    assert _has_qemu_device(vf, "edu")
    assert "-device e1000,netdev=n0" in run
    assert _has_qemu_device(vf, "e1000,netdev=n0")
    for dev in ("i6300esb", "sdhci-pci"):
        assert f"--qemu '-device {dev}'" in run
        assert _has_qemu_device(vf, dev)
    for n, size in ((0, "64M"), (1, "1G"), (2, "8G")):
        backend = f"memory-backend-memfd,id=iv{n},size={size}"
        assert f"-object {backend} -device ivshmem-plain,memdev=iv{n}" in run
        assert f'libvirt.qemuargs value: "{backend}"' in vf
        assert _has_qemu_device(vf, f"ivshmem-plain,memdev=iv{n}")
    assert '--append "modprobe.blacklist=e1000,i6300esb,sdhci_pci ngvm.bpfcache=$BPFCACHE"' in run
    assert "modprobe.blacklist=e1000,i6300esb,sdhci_pci" in vf
    # the same guest suite, with the switch that un-skips it
    assert ("pytest -v -p no:cacheprovider --durations=25 -m 'not single_tcg and not "
            "second_boot and not oops' tests/guest") in run
    assert ("--accel tcg-single" in run and
            "-m 'single_tcg or second_boot or oops' tests/guest" in run)
    assert "NGVM_GUEST=1" in vf and "NGVM_ACCEL=#{NGVM_ACCEL}" in vf
    assert ('.venv/bin/python -m pytest -v -p no:cacheprovider --durations=25 '
            '${sel:+-m "$sel"} tests/guest'
            in vf)
    # the box's four boots select what tests/run's four guests do
    boots = dict((name, (cmdline, sel)) for name, cmdline, sel in re.findall(
        r'^  "(\w+)" => \{ cmdline: "([^"]*)", select: "([^"]*)" \},$', vf, re.M))
    assert set(boots) == {"main", "second", "signed", "integrity"}, boots
    assert 'main,tcg-*) sel="$sel and not single_tcg" ;;' in vf
    assert 'second,tcg-single) sel="$sel or single_tcg" ;;' in vf
    run_sel = re.findall(r"pytest -v -p no:cacheprovider (?:--durations=25 )?-m '([^']+)' "
                         r"tests/guest", run)
    assert len(run_sel) == 2, run_sel
    markers = ("single_tcg", "second_boot", "oops")
    combos = [frozenset(m for m, on in zip(markers, bits, strict=True) if on)
              for bits in itertools.product((0, 1), repeat=len(markers))]

    def chosen(sel: str) -> set[frozenset]:
        expr = Expression.compile(sel)
        return {c for c in combos if expr.evaluate(lambda m, c=c: m in c)}

    assert chosen(boots["main"][1] + " and not single_tcg") == chosen(run_sel[0])
    assert chosen(boots["second"][1] + " or single_tcg") == chosen(run_sel[1])
    # under KVM the main boot runs the single_tcg tests: nothing is left out
    assert chosen(boots["main"][1]) | chosen(boots["second"][1]) == set(combos)
    assert boots["signed"] == ("module.sig_enforce=1", "")
    assert boots["integrity"] == ("lockdown=integrity intel_iommu=on", "")
    assert '--append "module.sig_enforce=1 ngvm.bpfcache=$BPFCACHE"' in run
    assert '--append "lockdown=integrity intel_iommu=on ngvm.bpfcache=$BPFCACHE"' in run
    # the IOMMU that boot's vfio test needs, before the device it translates
    assert "--qemu '-device intel-iommu,intremap=on' --qemu '-device edu'" in run
    assert re.search(r'libvirt\.qemuargs value: "-device"\n\s*libvirt\.qemuargs value: '
                     r'"intel-iommu,intremap=on"\n(\s*#.*\n)*\s*libvirt\.qemuargs value: '
                     r'"-device"\n\s*libvirt\.qemuargs value: "edu,addr=0x10"', vf), \
        "the Vagrantfile's intel-iommu must come right before edu"
    suite = (VAGRANT_DIR / "run-suite").read_text()
    for step in ("run_boot_tests main", 'reboot_with "" single',
                 "NGVM_TCG_THREAD=single run_boot_tests second",
                 'reboot_with "module.sig_enforce=1"', "run_boot_tests signed",
                 'reboot_with "lockdown=integrity intel_iommu=on"', "run_boot_tests integrity"):
        assert f"\n    {step}\n" in suite or f"\n{step}\n" in suite, step


def _assigned_words(script: str, var: str) -> set[str]:
    """The words of a shell assignment VAR="..." (which may span lines)."""
    m = re.search(rf'^{var}="([^"]*)"', script, re.M)
    assert m, f'no {var}="..." assignment'
    return set(m.group(1).split())


def setup_sh_packages(script: str) -> set[str]:
    """Every Debian package tests/setup.sh names for installing: its PKGS,
    the literal names of its `for p in NAME...; do` loops, and literal names
    given to apt-get install (names with a shell expansion, such as
    linux-headers-$KVER, are left out: they are not known before it runs)."""
    pkgs = _assigned_words(script, "PKGS")
    for m in re.finditer(r"^\s*for p in ([^;]*); do", script, re.M):
        pkgs |= {w for w in m.group(1).split() if "$" not in w}
    for m in re.finditer(r"apt-get install ([^\n;&|>]*)", script):
        pkgs |= {w for w in m.group(1).split() if not w.startswith("-") and "$" not in w}
    return pkgs


def make_box_packages(script: str) -> set[str]:
    """The Debian packages vagrant/make-box installs in the box."""
    return (_assigned_words(script, "SETUP_PKGS")
            | _assigned_words(script, "SETUP_PKGS_NO_RECOMMENDS")
            | _assigned_words(script, "BOX_PKGS"))


def test_setup_sh_packages_parsed():
    # the parser finds what setup.sh installs in each of its forms, so that
    # the coverage test below cannot pass on an empty set
    pkgs = setup_sh_packages(SETUP_SH.read_text())
    assert {"linux-image-amd64", "linux-headers-amd64", "python3-bpfcc", "gcc"} <= pkgs
    assert {"vagrant", "vagrant-libvirt", "dkms"} <= pkgs
    assert not any("$" in p or p.startswith("-") for p in pkgs), pkgs
    assert setup_sh_packages('PKGS="a b\nc"\nfor p in d $X; do :; done\n'
                             'apt-get install -y -q --no-install-recommends e "$f" >/dev/null\n'
                             ) == {"a", "b", "c", "d", "e"}


def test_make_box_has_every_package_of_setup_sh():
    missing = setup_sh_packages(SETUP_SH.read_text()) - make_box_packages(MAKE_BOX.read_text())
    assert not missing, (f"tests/setup.sh installs {sorted(missing)}, which vagrant/make-box "
                         "does not put in the box: add them to its SETUP_PKGS (installed with "
                         "their Recommends, as setup.sh does) or SETUP_PKGS_NO_RECOMMENDS")


def test_make_box_matches_the_vagrantfile():
    vf = VAGRANTFILE.read_text()
    mb = MAKE_BOX.read_text()
    # the wheelhouse the box carries is where the setup step looks for it
    wheelhouse = re.search(r"^WHEELHOUSE=(\S+)", mb, re.M).group(1)
    assert f'WHEELHOUSE = "{wheelhouse}".freeze' in vf
    assert "export PIP_NO_INDEX=1 PIP_FIND_LINKS=#{WHEELHOUSE}" in vf
    # make-box takes the box name from the Vagrantfile, which names one box
    assert len(re.findall(r'^ *config\.vm\.box *= *"[^"]+"', vf, re.M)) == 1
    # a box made by make-box, the kernel step installs nothing (no network)
    assert "linux-image-amd64 linux-headers-amd64 2>/dev/null)" in vf


def test_vagrant_scripts_parse():
    for script in (MAKE_BOX, VAGRANT_DIR / "run-suite"):
        assert os.access(script, os.X_OK), f"{script} is not executable"
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                             check=False)
        assert res.returncode == 0, res.stderr


def run_suite_with(tmp_path: Path, plugin: bool) -> tuple[subprocess.CompletedProcess, list]:
    """run-suite with a PATH of the few tools it needs before its checks and
    a fake vagrant (whose plugin list has vagrant-libvirt or not); the lines
    its check must print, from what that PATH (and /usr/sbin, /sbin) has."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("bash", "dirname", "mkdir", "grep"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    listed = "vagrant-libvirt (0.11.2, system)" if plugin else "vagrant-share (2.0.0, system)"
    (bin_ / "vagrant").write_text(
        f"#!/bin/bash\n[ \"$1 $2\" = 'plugin list' ] && echo '{listed}'\n")
    (bin_ / "vagrant").chmod(0o755)
    text = (VAGRANT_DIR / "run-suite").read_text()
    pairs = re.findall(r"^    ([\w.-]+):([\w.-]+)$", text, re.M)
    assert ("dnsmasq", "dnsmasq-base") in pairs and ("vagrant", "vagrant") in pairs
    want = [f"run-suite: {cmd} is missing (Debian package {pkg})" for cmd, pkg in pairs
            if shutil.which(cmd, path=str(bin_)) is None]
    if not plugin:
        want.append("run-suite: vagrant's libvirt provider is missing (Debian package "
                    "vagrant-libvirt)")
    res = subprocess.run([str(bin_ / "bash"), str(VAGRANT_DIR / "run-suite"), "-k", "x"],
                         env={"PATH": str(bin_), "NGVM_LOG_DIR": str(tmp_path / "log"),
                              "NGVM_SBIN": str(tmp_path / "sbin")},
                         capture_output=True, text=True, timeout=60)
    return res, want


@pytest.mark.parametrize("plugin", [True, False])
def test_run_suite_names_each_missing_prerequisite_and_its_package(tmp_path, plugin):
    """A runner without libvirt (or vagrant-libvirt): one line per missing
    command with its Debian package, the apt-get line, exit 2, nothing
    started."""
    res, want = run_suite_with(tmp_path, plugin)
    lines = res.stderr.splitlines()
    assert res.returncode == 2, res.stderr
    assert want and lines[:len(want)] == want, (lines, want)
    packages = re.search(r'^PACKAGES="([^"]+)"', (VAGRANT_DIR / "run-suite").read_text(),
                         re.M)[1]
    assert lines[len(want):] == [f"run-suite: install them: apt-get install "
                                 f"--no-install-recommends {packages} (or run-suite "
                                 "--install-prerequisites)"]
    # the README gives the same list
    readme = (VAGRANT_DIR / "README.md").read_text()
    assert f"apt-get install --no-install-recommends {packages}" in " ".join(readme.split())


STUB_VIRSH = r"""#!/bin/bash
# virsh with a default network and pool in the states of $STATE/{net,pool}
# ("none", "inactive" or "active"); each call is logged in $STATE/calls
echo "$*" >>"$STATE/calls"
while [ "${1:-}" = -q ] || [ "${1:-}" = -c ]; do [ "$1" = -c ] && shift; shift; done
net=$(cat "$STATE/net") pool=$(cat "$STATE/pool")
case "$1" in
    version) echo "Compiled against library: libvirt 9.0.0" ;;
    # the lines after the state come a moment later, as from a real virsh:
    # a reader that leaves at the state's line makes this one's next write
    # fail (SIGPIPE)
    net-info) [ "$net" = none ] && exit 1
              echo "Name:           default"
              [ "$net" = active ] && echo "Active:         yes" || echo "Active:         no"
              sleep 0.2; echo "Persistent:     yes"; echo "Autostart:      no" ;;
    net-define) echo inactive >"$STATE/net" ;;
    net-start) [ "$net" = inactive ] || exit 1; echo active >"$STATE/net" ;;
    pool-info) [ "$pool" = none ] && exit 1
               echo "Name:           default"
               [ "$pool" = active ] && echo "State:          running" ||
                   echo "State:          inactive"
               sleep 0.2; echo "Persistent:     yes"; echo "Autostart:      no" ;;
    pool-define-as) [ "$pool" = none ] || { echo "pool 'default' already exists" >&2; exit 1; }
                    echo inactive >"$STATE/pool" ;;
    pool-build) ;;
    pool-start) [ "$pool" = inactive ] || exit 1; echo active >"$STATE/pool" ;;
    net-autostart | pool-autostart) ;;
    *) exit 1 ;;
esac
"""


@pytest.mark.parametrize("net,pool", [("active", "inactive"), ("none", "none"),
                                      ("inactive", "active")])
def test_run_suite_starts_the_default_network_and_pool(tmp_path, net, pool):
    """With libvirt stubbed (every prerequisite present, a virsh that keeps
    the default network's and pool's states): a pool that exists but is
    inactive is started, not defined again (vagrant-libvirt's "pool
    'default' already exists"); a missing one is defined, built and started;
    the same for the network; both are marked for autostart and running
    before `vagrant up`, which fails here (exit 125)."""
    bin_, state = tmp_path / "bin", tmp_path / "state"
    bin_.mkdir()
    state.mkdir()
    (state / "net").write_text(net + "\n")
    (state / "pool").write_text(pool + "\n")
    for tool in ("bash", "dirname", "mkdir", "grep", "cat", "seq", "sleep", "tee", "sed"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    stubs = {
        "vagrant": "#!/bin/bash\necho \"vagrant $*\" >>\"$STATE/calls\"\n"
                   "case \"$1 ${2:-}\" in\n"
                   "'plugin list') echo 'vagrant-libvirt (0.11.2, system)'; sleep 0.2\n"
                   "  echo 'vagrant-share (2.0.0, system)';;\n"
                   "up*) echo 'up failed here' >&2; exit 1;; esac\n",
        "virsh": STUB_VIRSH,
        "pgrep": "#!/bin/bash\nexit 0\n",     # virtlogd runs
    }
    text = (VAGRANT_DIR / "run-suite").read_text()
    for cmd, _pkg in re.findall(r"^    ([\w.-]+):([\w.-]+)$", text, re.M):
        stubs.setdefault(cmd, "#!/bin/sh\nexit 0\n")
    for name, body in stubs.items():
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(0o755)
    res = subprocess.run([str(bin_ / "bash"), str(VAGRANT_DIR / "run-suite")],
                         env={"PATH": str(bin_), "NGVM_LOG_DIR": str(tmp_path / "log"),
                              "NGVM_SBIN": str(tmp_path / "sbin"), "STATE": str(state),
                              "NGVM_DRIVER": "kvm"},
                         capture_output=True, text=True, timeout=60)
    calls = [c.removeprefix("-q -c qemu:///system ")
             for c in (state / "calls").read_text().splitlines()]
    assert res.returncode == 125, res.stderr
    assert "run-suite: vagrant up: exit status 1" in res.stderr, res.stderr
    assert (state / "net").read_text().strip() == "active"
    assert (state / "pool").read_text().strip() == "active"
    assert ("net-define /usr/share/libvirt/networks/default.xml" in calls) == (net == "none")
    assert ("net-start default" in calls) == (net != "active")
    assert (any(c.startswith("pool-define-as default") for c in calls)) == (pool == "none")
    assert ("pool-start default" in calls) == (pool != "active")
    assert "net-autostart default" in calls and "pool-autostart default" in calls
    up = calls.index("vagrant up --no-tty --provider=libvirt")
    assert calls.index("pool-autostart default") < up, calls
    said = {"inactive": "run-suite: starting libvirt's default storage pool",
            "none": "run-suite: defining libvirt's default storage pool"}
    if pool in said:
        assert said[pool] in res.stderr, res.stderr


def test_run_suite_adds_up_every_summary_line_of_each_boot(tmp_path):
    """The totals count pytest's -v summary lines and -q's (the host tests
    of the main boot and of the recordings), deselected ones not at all."""
    text = (VAGRANT_DIR / "run-suite").read_text()
    func = re.search(r"^summary_lines\(\) \{\n.*?^\}$.*?^add_counts\(\) \{\n.*?^\}$", text,
                     re.M | re.S)
    assert func, "no add_counts() in run-suite"
    logs = {
        "main": "    default: 5 passed in 397.59s (0:06:37)\n"
                "    default: ===== 250 passed, 11 deselected in 1226.25s (0:20:26) =====\n"
                "    default: 10 passed, 1 deselected in 114.96s (0:01:54)\n"
                "    default: tests/guest/test_x.py::test_passed_in_1s PASSED [ 5%]\n",
        "second": "    default: ===== 4 passed, 1 failed, 256 deselected in 98.63s =====\n"
                  "    default: 1 passed, 10 deselected in 3.97s\n",
        "signed": "    default: ===== 3 passed, 258 deselected in 4.93s =====\n",
    }
    for name, body in logs.items():
        (tmp_path / name).write_text(body)
    script = (func[0] + "\n" + "".join(f"add_counts {tmp_path / n}\n" for n in logs)
              + 'for w in "${!COUNTS[@]}"; do echo "$w ${COUNTS[$w]}"; done\n')
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    got = dict(line.split() for line in res.stdout.splitlines())
    assert got == {"passed": str(5 + 250 + 10 + 4 + 1 + 3), "failed": "1"}, got
