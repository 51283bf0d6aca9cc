"""BPF objects for both tracers: where the sources are, compiled by bcc (in
a thread, cached), their maps created and programs loaded."""

from __future__ import annotations

import ctypes
import errno
import functools
import importlib.util
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import bpfsys
from .bpfobj import (
    CACHE_DIR,
    BpfObject,
    MapSpec,
    ObjectError,
    cache_key,
    load_cached,
    relocate,
    store,
)
from .phases import PHASES

PKG = Path(__file__).resolve().parents[1]     # the package
# In a checkout the sources sit beside the package; installed, they are
# shipped inside it (see pyproject.toml).
SEARCH = [PKG / "data", PKG.parent]


class LoaderError(Exception):
    """BPF could not be compiled or attached; the message says why."""


def source_dir(name: str) -> Path:
    for base in SEARCH:
        if (base / name).is_dir():
            return base / name
    raise LoaderError(f"cannot find the {name}/ sources of mmiotrace-ng")


BPF_PROG_TYPE_KPROBE = 2
BPF_PROG_TYPE_RAW_TRACEPOINT = 17
BPF_PROG_TYPE_RAW_TRACEPOINT_WRITABLE = 24
# Kprobes are made by the kprobe PMU (bpfsys.attach_kprobe), never as
# tracefs events, which would outlive a killed tracer.  A return probe has
# the kernel's default number of instances (2 per CPU, at least 10); a
# missed return is counted as lost by on_ioremap_entry.
VERIFIER_LOG_BYTES = 1 << 20   # for the message when a program is refused


def bcc_version() -> str:
    """The version of bcc's Python bindings, read without importing them
    (which loads libbcc and LLVM: a cached start needs neither)."""
    spec = importlib.util.find_spec("bcc")
    if spec is None or not spec.submodule_search_locations:
        raise LoaderError("bcc's Python bindings are missing: install python3-bpfcc "
                          "(Debian/Ubuntu) and run with the system python3")
    text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    if not m:
        raise LoaderError("cannot tell the version of bcc's Python bindings")
    return m.group(1)


@functools.cache
def _libbcc():
    """bcc's ctypes handle on libbcc, for compiling, with the prototypes it
    does not declare (set once)."""
    try:
        from bcc.libbcc import lib
    except ImportError as exc:
        raise LoaderError("bcc's Python bindings are missing: install python3-bpfcc "
                          "(Debian/Ubuntu) and run with the system python3") from exc
    c = ctypes
    lib.bpf_num_tables.restype = c.c_ulonglong
    lib.bpf_num_tables.argtypes = [c.c_void_p]
    for fn in ("bpf_table_fd_id", "bpf_table_type_id", "bpf_table_flags_id"):
        getattr(lib, fn).restype = c.c_int
        getattr(lib, fn).argtypes = [c.c_void_p, c.c_ulonglong]
    for fn in ("bpf_table_max_entries_id", "bpf_table_key_size_id", "bpf_table_leaf_size_id"):
        getattr(lib, fn).restype = c.c_size_t
        getattr(lib, fn).argtypes = [c.c_void_p, c.c_ulonglong]
    lib.bpf_table_name.restype = c.c_char_p
    lib.bpf_table_name.argtypes = [c.c_void_p, c.c_ulonglong]
    return lib


def compile_object(source: Path, cflags: list[str], programs: tuple[str, ...],
                   optional: tuple[str, ...] = ()) -> BpfObject:
    """Compile with bcc and keep the bytecode and map descriptions (bcc's own
    maps and module are released again; the descriptors stay recorded).
    Each of programs must be in the source; those of optional that are not
    (left out by its #if) are not in the object."""
    lib = _libbcc()
    from bcc import BPF

    try:
        b = BPF(src_file=str(source), cflags=cflags)
    except Exception as exc:  # bcc raises plain Exception on compile errors
        raise LoaderError(f"cannot compile the BPF programs: {exc} (kernel headers for "
                          "this kernel installed? /lib/modules/$(uname -r)/build)") from exc
    try:
        m = b.module
        maps = []
        for i in range(lib.bpf_num_tables(m)):
            maps.append(MapSpec(
                name=lib.bpf_table_name(m, i).decode(), fd=lib.bpf_table_fd_id(m, i),
                type=lib.bpf_table_type_id(m, i), key_size=lib.bpf_table_key_size_id(m, i),
                value_size=lib.bpf_table_leaf_size_id(m, i),
                max_entries=lib.bpf_table_max_entries_id(m, i),
                flags=lib.bpf_table_flags_id(m, i)))
        progs = {}
        for name in (*programs, *optional):
            start = lib.bpf_function_start(m, name.encode())
            size = lib.bpf_function_size(m, name.encode())
            if not start or not size:
                if name in optional:
                    continue
                raise LoaderError(f"the BPF source has no function {name}")
            progs[name] = ctypes.string_at(start, size)
        return BpfObject(maps, progs, lib.bpf_module_license(m).decode(),
                         lib.bpf_module_kern_version(m))
    finally:
        b.cleanup()


class Prefetch(threading.Thread):
    """`compiled` in a thread.  bcc's compiler runs without the GIL, so a
    first start compiles while the tracer loads the helper module and the
    netlink code (a second of a TCG guest's start)."""

    def __init__(self, source: Path, programs: tuple[str, ...], cache_dir: Path | None,
                 **kw: Any) -> None:
        super().__init__(name="BPF compile", daemon=True)
        self.args = (source, programs, cache_dir)
        self.kw = kw
        self.result: tuple[BpfObject, bool] | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.compiling = False      # not in the cache: bcc compiles it

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            self.result = _compiled(*self.args, on_compile=self._compiling, **self.kw)
        except BaseException as exc:  # noqa: BLE001 (raised again by `compiled`)
            self.error = exc
        self.seconds = time.monotonic() - t0

    def _compiling(self) -> None:
        self.compiling = True


_prefetches: dict[tuple[Path, Path | None], Prefetch] = {}


def prefetch(source: Path, programs: tuple[str, ...],
             cache_dir: Path | None = CACHE_DIR, **kw: Any) -> None:
    """Start getting the object of source; `compiled` takes it over."""
    if (source, cache_dir) not in _prefetches:
        _prefetches[(source, cache_dir)] = t = Prefetch(source, programs, cache_dir, **kw)
        t.start()


def prefetch_running() -> bool:
    """Whether a prefetch is still at work (its result was never taken)."""
    return any(t.is_alive() for t in _prefetches.values())


def compiled(source: Path, programs: tuple[str, ...],
             cache_dir: Path | None = CACHE_DIR, *, optional: tuple[str, ...] = (),
             defines: Callable[[], list[str]] | None = None) -> tuple[BpfObject, bool]:
    """The object of source (the bpf/ and kmod/ headers beside it), from the
    cache or compiled now (or by the `prefetch` begun for it); and whether it
    came from the cache.  programs must be in it, optional may be; defines
    gives more -D flags when it is compiled, of what the cache key already
    holds (the running kernel)."""
    t = _prefetches.pop((source, cache_dir), None)
    if t is None:
        return _compiled(source, programs, cache_dir, on_compile=_say_compiling,
                         optional=optional, defines=defines)
    t.join(0.2)
    if t.is_alive() and t.compiling:
        _say_compiling()
    t.join()
    if t.error is not None:
        raise t.error
    assert t.result is not None
    PHASES.note(f"the BPF object took {t.seconds:.2f} s in the background")
    return t.result


def _say_compiling() -> None:
    print("mmiotrace-ng: compiling the BPF programs (once per kernel) ...",
          file=sys.stderr, flush=True)


def _compiled(source: Path, programs: tuple[str, ...], cache_dir: Path | None,
              on_compile: Callable[[], None], optional: tuple[str, ...] = (),
              defines: Callable[[], list[str]] | None = None) -> tuple[BpfObject, bool]:
    cflags = [f"-I{source_dir('bpf')}", f"-I{source_dir('kmod')}"]
    headers = [*source_dir("bpf").glob("*.h"), *source_dir("kmod").glob("*.h")]
    key = cache_key(source, headers, cflags, bcc_version())
    obj = load_cached(key, cache_dir) if cache_dir else None
    if obj is not None:
        return obj, True
    _libbcc()           # bcc's Python side first: what follows runs without the GIL
    on_compile()
    obj = compile_object(source, [*cflags, *(defines() if defines else [])], programs, optional)
    if cache_dir:
        store(key, obj, cache_dir)
    return obj, False


def create_maps(obj: BpfObject, sizes: dict[str, int],
                fds_out: list[int]) -> tuple[dict[str, int], dict[int, int]]:
    """The object's maps (max_entries from sizes where named there): name ->
    descriptor, and the object's descriptors -> the new ones.  Every
    descriptor made is appended to fds_out, also when a later one fails."""
    fds, by_old = {}, {}
    for m in obj.maps:
        try:
            fd = bpfsys.map_create(m.type, m.name, m.key_size, m.value_size,
                                   sizes.get(m.name, m.max_entries), m.flags)
        except OSError as exc:
            raise LoaderError(f"cannot create the BPF map {m.name}: {exc.strerror}") from exc
        fds_out.append(fd)
        fds[m.name], by_old[m.fd] = fd, fd
    return fds, by_old


def load_program(kind: int, name: str, obj: BpfObject, by_old: dict[int, int]) -> int:
    """Load one program of obj, its maps relocated; LoaderError with the
    verifier's reasons if the kernel refuses it.  The first try asks for no
    log: the verifier is faster without, and a log that does not fit would
    make the load fail."""
    try:
        code = relocate(obj.progs[name], by_old)
    except (KeyError, ObjectError) as exc:
        raise LoaderError(f"the BPF object is unusable: {exc}") from exc
    try:
        return bpfsys.prog_load(kind, name, code, obj.license, obj.kern_version)
    except OSError as exc:
        err = exc.errno
    if err in (errno.E2BIG, errno.ENOSPC):
        # the verifier gave up on the program's size: its log would
        # take as long again to write, and says no more
        raise LoaderError(f"the kernel's verifier refused the BPF program {name}: "
                          f"{os.strerror(err)} (too complex for this kernel)")
    log = ctypes.create_string_buffer(VERIFIER_LOG_BYTES)
    try:
        return bpfsys.prog_load(kind, name, code, obj.license, obj.kern_version, log)
    except OSError:     # again, for the reasons
        tail = log.value.decode(errors="replace").strip().splitlines()[-12:]
        raise LoaderError(f"the kernel refused the BPF program {name} "
                          f"({os.strerror(err)}):\n" + "\n".join(tail)) from None


def map_update(maps: dict[str, int], name: str, key: ctypes._CData,
               value: ctypes._CData) -> None:
    try:
        bpfsys.map_update(maps[name], key, value)
    except OSError as exc:
        raise LoaderError(f"cannot update the BPF map {name}: {exc.strerror}") from exc


def map_lookup(maps: dict[str, int], name: str, key: ctypes._CData,
               value: ctypes._CData) -> None:
    try:
        bpfsys.map_lookup(maps[name], key, value)
    except OSError as exc:
        raise LoaderError(f"cannot read the BPF map {name}: {exc.strerror}") from exc


def read_drops(map_fd: int) -> tuple[int, int]:
    """The per-CPU drop counters of a program (the map "drops": slot 0,
    records dropped in all; slot 1, dropped but not yet reported in a
    record), summed over the CPUs."""
    ncpu = bpfsys.possible_cpus()
    out = []
    for slot in (0, 1):
        vals = (ctypes.c_uint64 * ncpu)()
        map_lookup({"drops": map_fd}, "drops", ctypes.c_int(slot), vals)
        out.append(sum(vals))
    return out[0], out[1]
