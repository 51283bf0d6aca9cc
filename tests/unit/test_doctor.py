"""mmiotrace-ng check (mmiotrace_ng/doctor.py) on made-up machines: a root
directory holding the files each check reads."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from mmiotrace_ng import doctor
from mmiotrace_ng.common import requirements
from mmiotrace_ng.common.errors import UsageError
from mmiotrace_ng.tracer import session

RELEASE = "6.1.0-57-amd64"
ALL_SET = "".join(f"CONFIG_{o}=y\n" for o in requirements.KERNEL_OPTIONS)


def machine(tmp_path: Path, config: str | None = ALL_SET, **files: str) -> Path:
    """A root with the given kernel configuration and files (path: text)."""
    if config is not None:
        (tmp_path / "boot").mkdir(parents=True)
        (tmp_path / "boot" / f"config-{RELEASE}").write_text(config)
    defaults = {
        "sys/kernel/tracing/trace_marker": "",
        "sys/kernel/tracing/current_tracer": "nop\n",
        "sys/kernel/btf/vmlinux": "",
        "sys/kernel/debug/kprobes/enabled": "1\n",
        "proc/sys/kernel/ftrace_enabled": "1\n",
        f"lib/modules/{RELEASE}/build/Makefile": "",
    }
    for path, text in {**defaults, **files}.items():
        p = tmp_path / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def by_name(root: Path) -> dict[str, requirements.Check]:
    return {c.name: c for c in requirements.run_checks(root, RELEASE)}


def test_a_machine_that_can_trace_passes_every_file_check(tmp_path):
    checks = by_name(machine(tmp_path))
    for name in ("kernel options", "tracefs", "BTF", "kprobes switch", "ftrace switch",
                 "kernel's mmiotrace", "lockdown", "module signatures", "helper module"):
        assert checks[name].ok is True, checks[name]
    assert "built on first use" in checks["helper module"].detail


def test_missing_kernel_options_are_named_with_why(tmp_path):
    config = ALL_SET.replace("CONFIG_KPROBES=y\n", "# CONFIG_KPROBES is not set\n")
    c = by_name(machine(tmp_path, config))["kernel options"]
    assert c.ok is False and "CONFIG_KPROBES (ioremap and iounmap are probed)" in c.detail
    assert "CONFIG_BPF_SYSCALL" not in c.detail


def test_kernel_options_from_proc_config_gz_or_not_known(tmp_path):
    root = machine(tmp_path, None)
    assert by_name(root)["kernel options"].ok is None
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / "config.gz").write_bytes(gzip.compress(ALL_SET.encode()))
    c = by_name(root)["kernel options"]
    assert c.ok is True and "config.gz" in c.detail


def test_switches_off_and_the_kernels_tracer_say_how_to_fix(tmp_path):
    checks = by_name(machine(tmp_path, **{
        "sys/kernel/debug/kprobes/enabled": "0\n", "proc/sys/kernel/ftrace_enabled": "0\n",
        "sys/kernel/tracing/current_tracer": "mmiotrace\n"}))
    for name, fix in (("kprobes switch", "echo 1 >"), ("ftrace switch", "ftrace_enabled=1"),
                      ("kernel's mmiotrace", "echo nop")):
        assert checks[name].ok is False and fix in checks[name].detail, checks[name]


def test_a_kprobes_switch_not_known_says_why(tmp_path):
    """No debugfs, or debugfs there but its writable files closed (as
    lockdown=integrity closes them): a warning each, with the reason."""
    root = machine(tmp_path / "a")
    (root / "sys/kernel/debug/kprobes/enabled").unlink()
    (root / "sys/kernel/debug/kprobes").rmdir()
    c = by_name(root)["kprobes switch"]
    assert (c.ok, c.detail) == (None, "not known: debugfs not mounted (mount -t debugfs none "
                                      "/sys/kernel/debug)")
    root = machine(tmp_path / "b")
    (root / "sys/kernel/debug/kprobes/enabled").unlink()
    (root / "sys/kernel/debug/kprobes/enabled").mkdir()       # cannot be read as a file
    c = by_name(root)["kprobes switch"]
    assert (c.ok, c.detail) == (None, "not known: /sys/kernel/debug/kprobes/enabled cannot be "
                                      "read (lockdown closes debugfs's writable files)")


def test_lockdown_confidentiality_fails_integrity_warns(tmp_path):
    path = "sys/kernel/security/lockdown"
    c = by_name(machine(tmp_path / "a", **{path: "none integrity [confidentiality]\n"}))
    assert c["lockdown"].ok is False and "nothing can be traced" in c["lockdown"].detail
    c = by_name(machine(tmp_path / "b", **{path: "none [integrity] confidentiality\n"}))
    assert c["lockdown"].ok is None and "signed" in c["lockdown"].detail
    c = by_name(machine(tmp_path / "c", **{path: "[none] integrity confidentiality\n"}))
    assert c["lockdown"].ok is True


def test_secure_boot_and_sig_enforce_say_the_helper_must_be_signed(tmp_path):
    c = by_name(machine(tmp_path / "a", **{"sys/module/module/parameters/sig_enforce": "Y\n"}))
    assert c["module signatures"].ok is None and "sig_enforce" in c["module signatures"].detail
    root = machine(tmp_path / "b")
    var = root / requirements.SECURE_BOOT
    var.parent.mkdir(parents=True)
    var.write_bytes(b"\x06\x00\x00\x00\x01")
    c = by_name(root)["module signatures"]
    assert c.ok is None and "Secure Boot is on" in c.detail and "mokutil" in c.detail


def test_no_helper_and_no_headers_fails(tmp_path):
    root = machine(tmp_path)
    (root / "lib" / "modules" / RELEASE / "build" / "Makefile").unlink()
    c = requirements.check_helper(root, RELEASE, None)
    assert c.ok is False and f"linux-headers-{RELEASE}" in c.detail
    dkms = root / "lib" / "modules" / RELEASE / "updates" / "dkms"
    dkms.mkdir(parents=True)
    (dkms / "mmiotng.ko.xz").write_bytes(b"")
    assert requirements.check_helper(root, RELEASE, None).ok is True


def test_format_one_line_each():
    assert doctor.format_check(requirements.Check("BTF", False, "no")) == "MISSING  BTF: no"
    assert doctor.format_check(requirements.Check("x", None, "y")).startswith("warning  x: y")


class Present(type(Path())):
    """A path that always exists (for the trace's own checks of /sys)."""

    def exists(self, *args, **kwargs) -> bool:
        return True


def test_the_trace_refuses_a_kernel_locked_down_for_confidentiality(monkeypatch):
    """The trace command's own checks include lockdown: one line, the
    doctor's words, before anything is loaded."""

    monkeypatch.setattr(session.os, "geteuid", lambda: 0)
    monkeypatch.setattr(session, "Path", Present)
    monkeypatch.setattr(session, "kernel_mmiotrace_active", lambda: False)
    monkeypatch.setattr(requirements, "trace_blocker", lambda **kw: None)
    monkeypatch.setattr(requirements, "check_lockdown", lambda root: requirements.Check(
        "lockdown", False, "confidentiality: the kernel refuses kprobes"))
    with pytest.raises(UsageError, match="locked down, confidentiality: the kernel refuses"):
        session.check_environment()
    monkeypatch.setattr(requirements, "check_lockdown",
                        lambda root: requirements.Check("lockdown", True, "none"))
    session.check_environment()


def test_the_trace_says_the_first_check_that_fails(tmp_path, monkeypatch):
    """The trace runs check's checks too: on a machine that can trace,
    none blocks it (ksym's own options may be missing); else the first
    failure, in check's words, in one line."""
    ksymless = ALL_SET.replace("CONFIG_KALLSYMS_ALL=y\n", "").replace(
        "CONFIG_HAVE_HW_BREAKPOINT=y\n", "")
    assert requirements.trace_blocker(machine(tmp_path / "a", ksymless), RELEASE) is None
    off = machine(tmp_path / "b", **{"proc/sys/kernel/ftrace_enabled": "0\n"})
    c = requirements.trace_blocker(off, RELEASE)
    assert c == requirements.Check("ftrace switch", False, "off: sysctl kernel.ftrace_enabled=1")
    nokprobes = machine(tmp_path / "c", ALL_SET.replace("CONFIG_KPROBES=y\n", ""),
                        **{"proc/sys/kernel/ftrace_enabled": "0\n"})
    assert requirements.trace_blocker(nokprobes, RELEASE).name == "kernel options"   # the first

    monkeypatch.setattr(session.os, "geteuid", lambda: 0)
    monkeypatch.setattr(session, "Path", Present)
    monkeypatch.setattr(session, "kernel_mmiotrace_active", lambda: False)
    monkeypatch.setattr(requirements, "check_lockdown",
                        lambda root: requirements.Check("lockdown", True, ""))
    monkeypatch.setattr(requirements, "trace_blocker", lambda **kw: c)
    with pytest.raises(UsageError) as exc:
        session.check_environment()
    assert str(exc.value) == ("ftrace switch: off: sysctl kernel.ftrace_enabled=1 "
                              "(mmiotrace-ng check lists every requirement)")


def test_an_unsigned_helper_refused_says_why_and_how(tmp_path):
    """insmod refused for want of a signature: the loader's one line says
    that the kernel loads signed modules only and how to sign the helper."""
    from mmiotrace_ng.tracer.kmodload import signing_hint

    refused = "insmod: ERROR: could not insert module mmiotng.ko: Key was rejected by service"
    root = machine(tmp_path / "a", **{"sys/module/module/parameters/sig_enforce": "Y\n"})
    hint = signing_hint(refused, root)
    assert hint and hint.startswith("the kernel refused the helper module: module.sig_enforce=1")
    assert "mokutil --import" in hint
    root = machine(tmp_path / "b", **{
        "sys/kernel/security/lockdown": "none [integrity] confidentiality\n"})
    hint = signing_hint("insmod: ERROR: ...: Operation not permitted", root)
    assert hint and "lockdown is integrity: only signed modules load" in hint
    assert signing_hint(refused, machine(tmp_path / "c")) is None     # nothing enforced
    assert signing_hint("insmod: ERROR: ...: Invalid module format", root) is None
