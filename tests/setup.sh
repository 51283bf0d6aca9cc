#!/bin/sh
# Install what mmiotrace-ng and its tests need, idempotently, on Debian 12
# (host, test guest root, or a Vagrant box): Debian packages, a venv that
# sees Debian's bcc, and the two kernel modules built for KVER.
# Usage: tests/setup.sh [--no-apt] [--distro-python] [--kernel VERSION]
# --distro-python (a release's root, tests/run --suite): no apt, no venv:
# the distribution's python3 with its own bcc, pyroute2, pytest and the
# rest, and the wheel installed with --no-deps, as a user of that release
# installs it.
# The kernel is Debian's default (the one linux-image-amd64 depends on,
# 6.1 on bookworm) unless --kernel (or KVER=) names another installed one;
# the last line printed is the version the modules were built for.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
NO_APT=
DISTRO=
while [ $# -gt 0 ]; do
    case $1 in
        --no-apt) NO_APT=1 ;;
        --distro-python) DISTRO=1; NO_APT=1 ;;
        --kernel) KVER=$2; shift ;;
        *) echo "usage: tests/setup.sh [--no-apt] [--distro-python] [--kernel VERSION]" >&2
           exit 2 ;;
    esac
    shift
done
# python3-wheel: for the `pip wheel --no-build-isolation` below (the venv's
# setuptools 66 has no bdist_wheel of its own; python3-pip would bring it)
PKGS="qemu-system-x86 linux-image-amd64 linux-headers-amd64 python3-bpfcc bpfcc-tools python3-pyroute2
busybox-static cpio pciutils kmod make gcc python3-venv python3-wheel linux-source-6.1 xz-utils zstd linux-perf groff-base"

log() { echo "setup: $*" >&2; }

if [ -z "$NO_APT" ]; then
    missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null |
              grep -q 'install ok installed' || echo "$p"; done)
    if [ -n "$missing" ]; then
        log "installing Debian packages:" $missing
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null
        apt-get install -y -q $missing >/dev/null
    fi
    # vagrant validates vagrant/ in the host tests; its recommends are a mail
    # and NFS server we do not want; dkms for the guest test of
    # `mmiotrace-ng install-helper` (its recommends: a compiler for every arch);
    # a Java runtime for pyspark (tests/unit/test_sql_spark.py)
    for p in vagrant vagrant-libvirt dkms default-jre-headless; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || {
            log "installing $p"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$p" >/dev/null; }
    done
fi
KVER=${KVER:-$("$repo/tests/default-kernel")}
if [ -z "$NO_APT" ] && [ ! -d "/lib/modules/$KVER/build" ]; then
    log "installing linux-headers-$KVER"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "linux-headers-$KVER" >/dev/null
fi
[ -d "/lib/modules/$KVER/build" ] || { log "no kernel headers for $KVER"; exit 2; }

if [ -n "$DISTRO" ]; then
    py=/usr/bin/python3
    "$py" -c 'import bcc, pyroute2, pytest, capstone, matplotlib' || {
        log "the root lacks a Python package the tests need"; exit 2; }
else
    py="$repo/.venv/bin/python"
    if [ ! -x "$py" ]; then
        log "creating $repo/.venv (sees Debian's bcc)"
        /usr/bin/python3 -m venv --system-site-packages "$repo/.venv"
    fi
    if ! "$py" -c 'import pyroute2, pytest, xdist, capstone, matplotlib, pyarrow, duckdb, pyspark' 2>/dev/null; then
        log "installing Python packages"
        # editable as a plain path (.pth), not setuptools' import hook: the
        # hook's imports cost every Python start half a second under TCG
        "$repo/.venv/bin/pip" install -q -e "$repo[test]" --config-settings editable_mode=compat
    fi
fi

# Byte-code for the checkout, as pip makes it for an installed package: the
# test VM runs Python with PYTHONDONTWRITEBYTECODE=1 (tests/vm/run), and
# compiling the modules at every start costs most of a second under TCG.
"$py" -m compileall -q -x 'tests/artifacts' "$repo/mmiotrace_ng" "$repo/tests" >/dev/null
# ... and pytest's rewritten byte-code of the test modules (it reads it
# where present but writes none under PYTHONDONTWRITEBYTECODE): each boot's
# collection then takes seconds, not half a minute.
(cd "$repo" && env -u PYTHONDONTWRITEBYTECODE "$py" -m pytest -q --co -p no:cacheprovider \
    tests/guest tests/recorded >/dev/null) || log "collecting the guest tests failed (they collect in the guest again)"

# the wheel users install, and the pyroute2 it needs, for the guest test
# of the installed tool (tests/guest/test_install.py) ...
dist="$repo/tests/artifacts/dist"
rm -rf "$dist" && mkdir -p "$dist"
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$dist" "$repo" >/dev/null
# ... installed here into a fresh venv as a user installs it (pip under TCG
# takes a minute and more, the guest test would spend it on pip); on a
# release's root with that release's pyroute2 (--no-deps)
installed="$repo/tests/artifacts/installed"
rm -rf "$installed"
/usr/bin/python3 -m venv --system-site-packages "$installed"
if [ -n "$DISTRO" ]; then
    # (PYTHONPATH off: the checkout on it would count as installed already)
    env -u PYTHONPATH "$installed/bin/pip" install -q --no-index --no-deps "$dist"/mmiotrace_ng-*.whl \
        >/dev/null
else
    # the distribution's pyroute2 (python3-pyroute2, which that venv sees)
    # satisfies the wheel; without it, the one .venv has, from PyPI (a box
    # of vagrant/make-box has no PyPI, and Debian's package)
    if ! /usr/bin/python3 -c 'import pyroute2' 2>/dev/null; then
        pyroute2=$("$py" -c 'import importlib.metadata as m; print(m.version("pyroute2"))')
        "$py" -m pip download -q --no-deps -d "$dist" "pyroute2==$pyroute2" >/dev/null
    fi
    "$installed/bin/pip" install -q --no-index --find-links "$dist" mmiotrace-ng >/dev/null
fi
[ -x "$installed/bin/mmiotrace-ng" ] || { log "the wheel was not installed into $installed"; exit 2; }

log "building the kernel modules for $KVER"
# (clean first: the checkout's objects may be another kernel's, or another
# release's compiler's)
for d in kmod tests/drivers/edu_exerciser; do
    make -s -C "/lib/modules/$KVER/build" M="$repo/$d" clean >/dev/null
    make -s -C "/lib/modules/$KVER/build" M="$repo/$d" modules >/dev/null
done
# the user program of the guest tests of user-space tracing
gcc -O2 -Wall -Werror -o "$repo/tests/drivers/user_mmio/user_mmio" \
    "$repo/tests/drivers/user_mmio/user_mmio.c"
# a helper that says it is of another interface version, for the guest test
# of a stale helper left loaded (tests/guest/test_reliability.py)
stale="$repo/tests/artifacts/stale-helper"
rm -rf "$stale" && mkdir -p "$stale" && cp "$repo"/kmod/*.[ch] "$repo/kmod/Kbuild" "$stale/"
rm -f "$stale"/*.mod.c
make -s -C "/lib/modules/$KVER/build" M="$stale" KCFLAGS=-DMMIOTNG_ABI_VERSION=1 modules >/dev/null
echo "$KVER"
