"""Find, build and load the mmiotng helper module; install it with DKMS."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..common.bpfload import LoaderError, source_dir
from ..common.phases import PHASES
from ..format.abi import MMIOTNG_ABI_VERSION

MODULE = "mmiotng"


def loaded() -> bool:
    return Path(f"/sys/module/{MODULE}").is_dir()


def _vermagic(ko: Path) -> str:
    out = subprocess.run(["modinfo", "-F", "vermagic", str(ko)], capture_output=True, text=True)
    return out.stdout.split(" ")[0].strip()


def _kmsg_end() -> int | None:
    """A descriptor of /dev/kmsg at its end (None where it cannot be read)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    os.lseek(fd, 0, os.SEEK_END)
    return fd


def _helper_said(fd: int | None) -> list[str]:
    """The helper's kernel-log lines since _kmsg_end() (its reasons for
    refusing to load: a hook it cannot take, a machine it cannot serve)."""
    if fd is None:
        return []
    said = []
    try:
        while True:
            try:
                rec = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:     # EPIPE: records overwritten meanwhile
                continue
            if not rec:
                break
            # "prio,seq,usec,flags;text", continuation lines start with " "
            for line in rec.splitlines():
                text = line.split(";", 1)[1] if ";" in line and line[:1] != " " else ""
                if text.startswith(f"{MODULE}: "):
                    said.append(text[len(MODULE) + 2:])
    finally:
        os.close(fd)
    return said


# what insmod says when the kernel wants a signature the module lacks
UNSIGNED_REFUSED = ("Key was rejected", "Required key not available", "Operation not permitted")


def signing_hint(insmod_stderr: str, root: Path = Path("/")) -> str | None:
    """Why the kernel refused the helper, if it loads signed modules only."""
    from ..common.requirements import check_lockdown, check_signing

    if not any(words in insmod_stderr for words in UNSIGNED_REFUSED):
        return None
    lockdown, signing = check_lockdown(root), check_signing(root)
    why = (signing.detail if signing.ok is None else
           f"lockdown is {lockdown.detail}" if lockdown.ok is not True else None)
    return f"the kernel refused the helper module: {why}" if why else None


def _insmod(ko: Path) -> None:
    PHASES.note(f"loading the helper module {ko}")
    kmsg = _kmsg_end()
    out = subprocess.run(["insmod", str(ko)], capture_output=True, text=True)
    said = _helper_said(kmsg)
    if out.returncode:
        if said:
            raise LoaderError(f"the helper module refused to load: {'; '.join(said)}")
        hint = signing_hint(out.stderr)
        if hint:
            raise LoaderError(hint)
        raise LoaderError(f"insmod {ko} failed: {out.stderr.strip()} (see dmesg)")


BUILT_FILES = ("*.o", "*.ko", "*.cmd", "*.mod*", ".*", "Module.symvers", "modules.order")


def _copy_sources(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source_dir("kmod"), dest, ignore=shutil.ignore_patterns(*BUILT_FILES))


def dkms_version() -> str:
    """PACKAGE_VERSION of the shipped dkms.conf."""
    m = re.search(r'^PACKAGE_VERSION="([^"]+)"', (source_dir("kmod") / "dkms.conf").read_text(),
                  re.M)
    if not m:
        raise LoaderError("the shipped dkms.conf names no PACKAGE_VERSION")
    return m[1]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise LoaderError(f"{cmd[0]} is not installed (Debian: apt install {cmd[0]})") from exc


def dkms_install(release: str) -> Path:
    """Put the shipped helper sources in /usr/src/mmiotng-VERSION, register
    them with DKMS (which rebuilds the helper for each new kernel) and build
    and install the helper for `release`.  Returns the installed module."""
    version = dkms_version()
    if not Path(f"/lib/modules/{release}/build").is_dir():
        raise LoaderError(f"no kernel headers to build the helper for {release}: "
                          f"install linux-headers-{release}")
    src = Path(os.environ.get("MMIOTNG_DKMS_SRC", "/usr/src")) / f"{MODULE}-{version}"
    ref = f"{MODULE}/{version}"
    if _run(["dkms", "status", ref]).stdout.strip():
        _run(["dkms", "remove", ref, "--all"])      # a reinstall: the sources may differ
    _copy_sources(src)
    # `dkms install` builds first (one dkms run less: each is seconds)
    for step in (["dkms", "add", str(src)], ["dkms", "install", ref, "-k", release]):
        out = _run(step)
        if out.returncode:
            raise LoaderError(f"{' '.join(step)} failed:\n{(out.stdout + out.stderr)[-2000:]}")
    path = _run(["modinfo", "-k", release, "-n", MODULE]).stdout.strip()
    return Path(path)


# written into a build directory after a build: what it was built from
STAMP = ".mmiotrace-ng-built-from"


def _sources_digest(release: str) -> str:
    """The shipped helper sources (names and contents) and the kernel."""
    from ..common.bpfobj import new_sha256

    h = new_sha256()
    h.update(release.encode() + b"\0")
    src = source_dir("kmod")
    ignored = shutil.ignore_patterns(*BUILT_FILES)(str(src), [p.name for p in src.iterdir()])
    for path in sorted(src.iterdir()):
        if path.is_file() and path.name not in ignored:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _built_before(work: Path, digest: str, release: str) -> bool:
    """Whether work holds a helper built from these sources for release, in
    a directory only root may write (the module is loaded into the kernel)."""
    from ..common.cachedir import trusted_dir

    ko = work / f"{MODULE}.ko"
    try:
        stamp = (work / STAMP).read_text()
    except OSError:
        return False
    return (stamp == digest and trusted_dir(work) and trusted_dir(work.parent)
            and ko.is_file() and _vermagic(ko) == release)


def _build(release: str) -> Path:
    """The helper for this kernel, built in a private copy of kmod/ (once:
    a later run loads that build while the sources are the same)."""
    kdir = Path(f"/lib/modules/{release}/build")
    work = Path(os.environ.get("MMIOTNG_BUILD_DIR", f"/var/cache/mmiotrace-ng/kmod-{release}"))
    digest = _sources_digest(release)
    if _built_before(work, digest, release):
        return work / f"{MODULE}.ko"
    if not kdir.is_dir():
        raise LoaderError(f"the helper module is not built and there are no kernel headers "
                          f"to build it: install linux-headers-{release}")
    _copy_sources(work)
    work.chmod(0o755)
    print(f"mmiotrace-ng: building the helper module for {release} ...", file=sys.stderr)
    out = subprocess.run(["make", f"-j{os.cpu_count() or 1}", "-C", str(kdir), f"M={work}",
                          "modules"],
                         capture_output=True, text=True)
    if out.returncode:
        raise LoaderError("building the helper module failed:\n" + out.stderr[-2000:])
    (work / STAMP).write_text(digest)
    return work / f"{MODULE}.ko"


def _loaded_abi() -> tuple[int, int]:
    """(ABI version, session owner) of the loaded helper; version 0 for a
    module older than the version attribute."""
    from .netlink import HelperError, HelperSocket

    try:
        with HelperSocket() as h:
            st = h.status()
    except HelperError as exc:
        raise LoaderError(f"the loaded helper module does not answer: {exc}") from exc
    return st.abi_version, st.owner


def _replace_stale() -> None:
    """A helper of another version is loaded: unload it, unless it is in use."""
    version, owner = _loaded_abi()
    if version == MMIOTNG_ABI_VERSION:
        return
    if owner:
        raise LoaderError(f"the loaded helper module ({MODULE}, interface {version}) is of "
                          f"another version (this mmiotrace-ng needs {MMIOTNG_ABI_VERSION}) "
                          "and another tracer is using it")
    print(f"mmiotrace-ng: replacing the loaded helper module (interface {version}, "
          f"needed {MMIOTNG_ABI_VERSION})", file=sys.stderr)
    out = subprocess.run(["rmmod", MODULE], capture_output=True, text=True)
    if out.returncode:
        raise LoaderError(f"the loaded helper module is of another version and cannot be "
                          f"unloaded: {out.stderr.strip()}")


def _check_ftrace() -> None:
    """The helper hooks the page fault with a permanent ftrace ops, which
    cannot be registered while ftrace is switched off: say so in one line."""
    try:
        enabled = Path("/proc/sys/kernel/ftrace_enabled").read_text().strip()
    except OSError:
        return
    if enabled == "0":
        raise LoaderError("cannot load the helper module: ftrace is disabled "
                          "(sysctl kernel.ftrace_enabled=0; set it to 1)")


def ensure_loaded(explicit: str | None = None) -> None:
    """Load the helper: --helper PATH, the checkout's build, DKMS (modprobe),
    or a fresh build.  A loaded helper of another interface version is
    replaced, one that modprobe found included."""
    if loaded():
        _replace_stale()
    if loaded():
        PHASES.note("the helper module is loaded already")
        return
    _check_ftrace()
    release = os.uname().release
    if explicit:
        _insmod(Path(explicit))
        return
    try:
        local = source_dir("kmod") / f"{MODULE}.ko"
    except LoaderError:
        local = None
    if local and local.exists() and _vermagic(local) == release:
        _insmod(local)
        return
    if subprocess.run(["modprobe", "-q", MODULE], capture_output=True).returncode == 0:
        version, _owner = _loaded_abi()
        if version == MMIOTNG_ABI_VERSION:
            PHASES.note("loaded the helper module modprobe found (DKMS)")
            return
        # an installed (DKMS) helper of an older mmiotrace-ng
        print(f"mmiotrace-ng: the installed helper module is of interface {version}, this "
              f"mmiotrace-ng needs {MMIOTNG_ABI_VERSION} (`mmiotrace-ng install-helper` "
              "updates it); building one", file=sys.stderr)
        _replace_stale()
    _insmod(_build(release))
