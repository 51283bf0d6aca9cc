"""What a machine needs to trace, checked one requirement at a time, each
with what is missing and how to fix it (the `check` command prints them;
a trace stops at the first that fails).

Each check reads files only (under root, "/" but in tests): the kernel's
configuration (/boot/config-RELEASE or /proc/config.gz), tracefs, BTF,
the kprobes and ftrace switches, the kernel's own mmiotrace, lockdown,
Secure Boot and module signature enforcement, the helper module (loaded,
installed with DKMS, or buildable from the kernel's headers) and the
Python modules the tracer imports.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
from pathlib import Path
from typing import NamedTuple

# What the tracer needs of the kernel, and why (docs/tracing.md#requirements).
KERNEL_OPTIONS: dict[str, str] = {
    "MODULES": "the helper is a module",
    "KPROBES": "ioremap and iounmap are probed",
    "KPROBE_EVENTS": "bcc attaches its kprobes through the kprobe PMU",
    "BPF_SYSCALL": "the tracer's programs are BPF",
    "BPF_EVENTS": "BPF programs on kprobes and tracepoints",
    "DEBUG_INFO_BTF": "the programs read the kernel's structures with BTF",
    "FUNCTION_TRACER": "the fault hook is an ftrace ops",
    "DYNAMIC_FTRACE_WITH_REGS": "the fault hook changes the instruction pointer (IPMODIFY)",
    "HAVE_HW_BREAKPOINT": "ksym watches variables with hardware breakpoints",
    "KALLSYMS_ALL": "ksym finds variables by name",
}
# the options only ksym needs (a trace of MMIO does without them)
KSYM_ONLY: frozenset[str] = frozenset({"HAVE_HW_BREAKPOINT", "KALLSYMS_ALL"})
# Secure Boot's EFI variable (the last byte of its value: 1 = on)
SECURE_BOOT = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


class Check(NamedTuple):
    name: str
    ok: bool | None          # None: not known (a warning)
    detail: str


_CONFIG_LINE = re.compile(r"^CONFIG_([^=\n]+)=(.*)$", re.MULTILINE)


def kernel_config(root: Path, release: str) -> tuple[dict[str, str], str] | None:
    """The running kernel's configuration and where it was read, if readable."""
    boot = root / "boot" / f"config-{release}"
    proc = root / "proc" / "config.gz"
    try:
        text, where = boot.read_text(errors="replace"), str(boot)
    except OSError:
        try:
            text = gzip.decompress(proc.read_bytes()).decode(errors="replace")
            where = str(proc)
        except (OSError, EOFError, gzip.BadGzipFile):
            return None
    # one regular expression over the text: a loop over its 10,000 lines
    # took a third of a second of a TCG guest's start
    return dict(_CONFIG_LINE.findall(text)), where


def check_options(root: Path, release: str, skip: frozenset[str] = frozenset()) -> Check:
    """The kernel options the tools need (but those in skip)."""
    found = kernel_config(root, release)
    if found is None:
        return Check("kernel options", None, f"not known: no /boot/config-{release} and no "
                     "/proc/config.gz (needs " + ", ".join(KERNEL_OPTIONS) + ")")
    opts, where = found
    missing = [o for o in KERNEL_OPTIONS if o not in skip and opts.get(o) not in ("y", "m")]
    if missing:
        return Check("kernel options", False, "not set in " + where + ": " + "; ".join(
            f"CONFIG_{o} ({KERNEL_OPTIONS[o]})" for o in missing) +
            ": a kernel built with them is needed")
    return Check("kernel options", True, f"all {len(KERNEL_OPTIONS)} set ({where})")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def check_files(root: Path) -> list[Check]:
    out = []
    tracing = root / "sys/kernel/tracing"
    out.append(Check("tracefs", (tracing / "trace_marker").exists(),
                     f"mounted at {tracing}" if (tracing / "trace_marker").exists() else
                     f"not mounted at {tracing}: mount -t tracefs nodev {tracing}"))
    btf = (root / "sys/kernel/btf/vmlinux").exists()
    out.append(Check("BTF", btf, "/sys/kernel/btf/vmlinux" if btf else
                     "no /sys/kernel/btf/vmlinux: a kernel with CONFIG_DEBUG_INFO_BTF"))
    switch = root / "sys/kernel/debug/kprobes/enabled"
    enabled = _read(switch)
    out.append(Check("kprobes switch", None if enabled is None else enabled != "0",
                     "on" if enabled not in (None, "0") else
                     "off: echo 1 > /sys/kernel/debug/kprobes/enabled" if enabled == "0" else
                     "not known: debugfs not mounted (mount -t debugfs none /sys/kernel/debug)"
                     if not (root / "sys/kernel/debug/kprobes").is_dir() else
                     "not known: /sys/kernel/debug/kprobes/enabled cannot be read (lockdown "
                     "closes debugfs's writable files)"))
    ftrace = _read(root / "proc/sys/kernel/ftrace_enabled")
    out.append(Check("ftrace switch", None if ftrace is None else ftrace != "0",
                     "not known: no /proc/sys/kernel/ftrace_enabled" if ftrace is None else
                     "on" if ftrace != "0" else "off: sysctl kernel.ftrace_enabled=1"))
    tracer = _read(tracing / "current_tracer")
    out.append(Check("kernel's mmiotrace", tracer != "mmiotrace",
                     "active: echo nop > /sys/kernel/tracing/current_tracer"
                     if tracer == "mmiotrace" else "not active"))
    out.append(check_lockdown(root))
    out.append(check_signing(root))
    return out


def check_lockdown(root: Path) -> Check:
    text = _read(root / "sys/kernel/security/lockdown")
    if text is None:
        return Check("lockdown", True, "none (no /sys/kernel/security/lockdown)")
    mode = text[text.find("[") + 1:text.find("]")] if "[" in text else text
    if mode == "confidentiality":
        return Check("lockdown", False, "confidentiality: the kernel refuses kprobes and BPF "
                     "reads of kernel memory, so nothing can be traced; boot with "
                     "lockdown=integrity or none")
    if mode == "integrity":
        return Check("lockdown", None, "integrity: only signed modules load; the helper must "
                     "be signed (install-helper, then DKMS signs it with its key; enroll the "
                     "key with mokutil --import)")
    return Check("lockdown", True, mode)


def check_signing(root: Path) -> Check:
    enforce = _read(root / "sys/module/module/parameters/sig_enforce") == "Y"
    try:
        secure = (root / SECURE_BOOT).read_bytes()[-1:] == b"\x01"
    except OSError:
        secure = False
    if not (enforce or secure):
        return Check("module signatures", True, "not enforced")
    why = "Secure Boot is on" if secure else "module.sig_enforce=1"
    return Check("module signatures", None, f"{why}: the helper loads only if signed with a "
                 "key the kernel trusts (install-helper builds it with DKMS, which signs it; "
                 "enroll DKMS's key: mokutil --import /var/lib/dkms/mok.pub, then reboot)")


def check_helper(root: Path, release: str, checkout_ko: Path | None) -> Check:
    if (root / "sys/module/mmiotng").exists():
        return Check("helper module", True, "loaded")
    mods = root / "lib/modules" / release
    for sub in ("updates/dkms", "extra", "updates"):
        for ko in (mods / sub).glob("mmiotng.ko*") if (mods / sub).is_dir() else ():
            return Check("helper module", True, f"installed: {ko}")
    if checkout_ko is not None and checkout_ko.exists():
        return Check("helper module", True, f"built in the checkout: {checkout_ko}")
    if (mods / "build" / "Makefile").exists():
        return Check("helper module", True, "not installed; it is built on first use "
                     f"from the kernel's headers ({mods / 'build'})")
    return Check("helper module", False, "not installed and no headers to build it: "
                 f"apt-get install linux-headers-{release}, then mmiotrace-ng install-helper")


def check_python() -> list[Check]:
    out = []
    for mod, pkg in (("bcc", "python3-bpfcc"), ("pyroute2", "python3-pyroute2")):
        spec = importlib.util.find_spec(mod)
        out.append(Check(f"Python module {mod}", spec is not None,
                         spec.origin or mod if spec is not None else
                         f"missing: apt-get install {pkg}"))
    return out


def run_checks(root: Path = Path("/"), release: str | None = None,
               checkout_ko: Path | None = None) -> list[Check]:
    release = release or os.uname().release
    return [Check("root", os.geteuid() == 0, "yes" if os.geteuid() == 0 else
                  "not root: run it with sudo"),
            check_options(root, release), *check_files(root),
            check_helper(root, release, checkout_ko), *check_python()]


def trace_blocker(root: Path = Path("/"), release: str | None = None,
                  checkout_ko: Path | None = None) -> Check | None:
    """The first check a trace of MMIO cannot do without that fails here
    (what `check` would print as MISSING, ksym's own needs left out), or
    None."""
    release = release or os.uname().release
    checks = [check_options(root, release, KSYM_ONLY), *check_files(root),
              check_helper(root, release, checkout_ko), *check_python()]
    # kprobes switched off: the session refuses that itself, in its own words
    return next((c for c in checks if c.ok is False and c.name != "kprobes switch"), None)
