"""The Debian releases the tests run on, each from its own packages.

bookworm is the host's own root (the default of every script).  Each other
suite is a root file system made with mmdebstrap from the release's
packages (tests/vm/make-root): its python3, bcc, pyroute2, pytest, gcc,
kernels and their headers.  tests/vm/run --suite boots one of its kernels
on it; tests/run --suite builds the modules and runs the host tests inside
it (chroot) and the guest tests in that boot.

A root is cached under ~/.cache/mmiotrace-ng/roots/ by a key made of its
package list: a changed list builds a new root.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MIRROR = os.environ.get("MIRROR", "http://deb.debian.org/debian")

# What every root holds besides its kernels: the tool's own dependencies
# (Debian's bcc and pyroute2), the tests' (pytest, capstone, matplotlib,
# venv and pip for the install test, dkms, perf, groff for the manual
# pages), the module build (build-essential) and the guest's tools.
# Debian package names, the same in every release.
COMMON = """python3 python3-bpfcc bpfcc-tools python3-pyroute2 python3-pytest
python3-capstone python3-matplotlib python3-venv python3-pip python3-setuptools
python3-wheel build-essential kmod pciutils busybox cpio xz-utils zstd gzip
iproute2 procps util-linux dkms linux-perf groff-base""".split()


@dataclass(frozen=True)
class Suite:
    name: str
    dists: tuple[str, ...]      # apt suites of the sources list, the first the release
    kernels: tuple[str, ...]    # kernel packages: images (headers follow)
    default: str                # the kernel booted unless --kernel names another
    # kernels whose headers the archive's index no longer lists (an older
    # backports kernel): images by name, headers from the pool by file name
    pool_kernels: tuple[str, ...] = ()
    pool_debs: tuple[str, ...] = ()
    # the optional Python packages (pyproject's extras) the release has:
    # the tests that need one require it there, and elsewhere test what
    # the command says without it
    extras: tuple[str, ...] = ()

    def packages(self) -> list[str]:
        pkgs = list(COMMON) + list(self.extras) + list(self.pool_kernels)
        for k in self.kernels:
            pkgs += [k, k.replace("linux-image-", "linux-headers-", 1)]
        return pkgs

    def key(self) -> str:
        text = "\n".join([self.name, *self.dists, *self.packages(), *self.pool_debs, MIRROR])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _image(ver: str) -> str:
    return f"linux-image-{ver}"


SUITES = {
    # Debian 13 and its backports' 6.17 (the backports metapackage has moved
    # on to 7.x: the 6.17 images are named by version)
    "trixie": Suite("trixie", ("trixie", "trixie-backports"),
                    (_image("6.12.117+deb13-amd64"), _image("6.12.117+deb13-rt-amd64")),
                    "6.12.117+deb13-amd64",
                    pool_kernels=(_image("6.17.13+deb13-amd64"),
                                  _image("6.17.13+deb13-rt-amd64")),
                    pool_debs=tuple(f"pool/main/l/linux/{n}_6.17.13-1~bpo13+1_{a}.deb" for n, a in (
                        ("linux-headers-6.17.13+deb13-amd64", "amd64"),
                        ("linux-headers-6.17.13+deb13-rt-amd64", "amd64"),
                        ("linux-headers-6.17.13+deb13-common", "all"),
                        ("linux-kbuild-6.17.13+deb13", "amd64")))),
    # unstable: Linux 7.2, Python 3.14, bcc 0.37, pyroute2 0.8; pyarrow
    # (export --parquet; trixie has none); DuckDB's Python module is in no
    # release
    "sid": Suite("sid", ("sid",),
                 (_image("7.2.13+deb14-amd64"), _image("7.2.13+deb14-rt-amd64")),
                 "7.2.13+deb14-amd64", extras=("python3-pyarrow",)),
}


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "mmiotrace-ng" / "roots"


def root_dir(suite: Suite) -> Path:
    return cache_root() / f"{suite.name}-{suite.key()}"


def kernel_versions(root: Path) -> list[str]:
    return sorted(p.name[len("vmlinuz-"):] for p in (root / "boot").glob("vmlinuz-*"))


def get(name: str) -> Suite:
    if name not in SUITES:
        raise SystemExit(f"unknown suite {name!r}; known: bookworm (the host), "
                         + ", ".join(SUITES))
    return SUITES[name]


def fetch_deb(path: str, log) -> Path:
    """A package file from the archive's pool, cached.  (Not in a signed
    index any more: it is checked to be a Debian package, and its name
    must match the one asked for.)"""
    out = cache_root() / "debs" / Path(path).name
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        log(f"fetching {path}")
        tmp = out.with_suffix(".part")
        with urllib.request.urlopen(f"{MIRROR}/{path}", timeout=120) as r, open(tmp, "wb") as fh:
            shutil.copyfileobj(r, fh)
        name = subprocess.run(["dpkg-deb", "-f", str(tmp), "Package"], capture_output=True,
                              text=True).stdout.strip()
        if not Path(path).name.startswith(name + "_") or not name:
            raise SystemExit(f"{path}: not the package asked for ({name or 'not a .deb'})")
        tmp.rename(out)
    return out


def make_root(suite: Suite, log=print) -> Path:
    """Build the suite's root with mmdebstrap unless its key is cached."""
    root = root_dir(suite)
    if (root / ".complete").exists():
        return root
    tmp = root.with_name(root.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the {suite.name} root in {root} (mmdebstrap, a few minutes)")
    # the pool's packages: copied in and installed once the rest is there
    hooks = []
    debs = [str(fetch_deb(path, log)) for path in suite.pool_debs]
    if debs:
        hooks = ["--customize-hook=mkdir -p \"$1/tmp/pool\"",
                 f"--customize-hook=copy-in {' '.join(debs)} /tmp/pool",
                 "--customize-hook=chroot \"$1\" sh -c 'apt-get -o "
                 "Acquire::Check-Valid-Until=false install -y -q --no-install-recommends "
                 "/tmp/pool/*.deb'",
                 "--customize-hook=rm -rf \"$1/tmp/pool\""]
    cmd = ["mmdebstrap", "--variant=apt", "--mode=root", *hooks,
           "--aptopt=Acquire::Check-Valid-Until \"false\"",
           "--aptopt=APT::Install-Recommends \"false\"",
           "--include=" + ",".join(suite.packages()),
           suite.dists[0], str(tmp), *(f"deb {MIRROR} {d} main" for d in suite.dists)]
    subprocess.run(cmd, check=True)
    (tmp / ".complete").write_text("\n".join(suite.packages()) + "\n")
    tmp.rename(root)
    return root


def chroot_cmd(root: Path, repo: Path, cmd: str, env: dict[str, str] | None = None) -> list[str]:
    """A command line that runs the shell command `cmd` inside the root, in
    the checkout (bind-mounted at its own path) with /proc, /sys and /dev
    of the host (objtool and modpost need them), in a mount namespace of
    its own: nothing stays mounted when it ends."""
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
    inner = (f"export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
             f"HOME=/root LANG=C.UTF-8 PYTHONPATH={shlex.quote(str(repo))}; "
             f"{exports}cd {shlex.quote(str(repo))} && {cmd}")
    r = shlex.quote(str(root))
    # the root a mount point of its own, so that a test's unshare can make
    # its mounts private (unshare --propagation needs / to be a mount)
    setup = (f"set -e; mount --bind {r} {r}; "
             f"for d in proc sys dev; do mount --rbind /$d {r}/$d; done; "
             f"mkdir -p {r}{shlex.quote(str(repo))}; "
             f"mount --bind {shlex.quote(str(repo))} {r}{shlex.quote(str(repo))}; ")
    for extra in SHARED_FILES:
        if Path(extra).exists():
            q = shlex.quote(extra)
            setup += f"mkdir -p {r}$(dirname {q}); touch {r}{q}; mount --bind {q} {r}{q}; "
    setup += f"exec chroot {r} /bin/sh -c {shlex.quote(inner)}"
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", setup]


# Host files a root's tests read: the kernel source checkpatch comes from
SHARED_FILES = ["/usr/src/linux-source-6.1.tar.xz"]
