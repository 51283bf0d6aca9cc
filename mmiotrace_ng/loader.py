"""Compile and attach the BPF programs (bcc), and drain their ring buffer."""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path

from .abi import MMIOTNG_HOOK_SYMBOL, MMIOTNG_MARK_HOOK_SYMBOL

PKG = Path(__file__).resolve().parent
# In a checkout the sources sit beside the package; installed, they are
# shipped inside it (see pyproject.toml).
SEARCH = [PKG / "data", PKG.parent]
IOREMAP_FAMILY = ("ioremap", "ioremap_uc", "ioremap_wc", "ioremap_wt", "ioremap_cache",
                  "ioremap_prot", "ioremap_encrypted")


BATCH = 16384   # records handed over per poll at most


class LoaderError(Exception):
    """BPF could not be compiled or attached; the message says why."""


def source_dir(name: str) -> Path:
    for base in SEARCH:
        if (base / name).is_dir():
            return base / name
    raise LoaderError(f"cannot find the {name}/ sources of mmiotrace-ng")


def kernel_functions(names: tuple[str, ...]) -> list[str]:
    """Those of names the running kernel has as functions (kallsyms)."""
    wanted = set(names)
    found = set()
    with open("/proc/kallsyms") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "tT" and parts[2] in wanted:
                found.add(parts[2])
    return [n for n in names if n in found]


@dataclass
class Ranges:
    """Physical ranges whose mappings produce MAP/UNMAP (or every one)."""

    ranges: list[tuple[int, int]]   # (start, end exclusive)
    all_maps: bool = False


class Probes:
    """The loaded BPF programs and their ring buffer."""

    def __init__(self, ranges: Ranges, buffer_kb: int) -> None:
        try:
            from bcc import BPF
        except ImportError as exc:
            raise LoaderError("bcc's Python bindings are missing: install python3-bpfcc "
                              "(Debian/Ubuntu) and run with the system python3") from exc
        pages = max(1, buffer_kb * 1024 // 4096)
        pages = 1 << (pages - 1).bit_length()  # the ring buffer wants a power of two
        self.buffer_bytes = pages * 4096
        rng = ranges.ranges or [(0, 0)]
        cflags = [
            f"-I{source_dir('bpf')}", f"-I{source_dir('kmod')}",
            f"-DNG_RINGBUF_PAGES={pages}",
            f"-DNG_ALL={int(ranges.all_maps)}",
            f"-DNG_NR_RANGES={len(rng)}",
            "-DNG_RANGES={" + ",".join(f"{{{s:#x}ULL,{e:#x}ULL}}" for s, e in rng) + "}",
        ]
        try:
            self.bpf = BPF(src_file=str(source_dir("bpf") / "mmiotrace_ng.bpf.c"), cflags=cflags)
        except Exception as exc:  # bcc raises plain Exception on compile errors
            raise LoaderError(f"cannot compile the BPF programs: {exc} (kernel headers for "
                              "this kernel installed? /lib/modules/$(uname -r)/build)") from exc
        self.attached: list[str] = []
        try:
            self._attach()
        except Exception:
            self.close()
            raise
        self._records: list[bytes] = []
        self.bpf["events"].open_ring_buffer(self._on_record)

    def _attach(self) -> None:
        b = self.bpf
        family = kernel_functions(IOREMAP_FAMILY)
        if not family:
            raise LoaderError("this kernel has no ioremap function to probe")
        for fn in family:
            b.attach_kprobe(event=fn, fn_name="on_ioremap_entry")
            b.attach_kretprobe(event=fn, fn_name="on_ioremap_return", maxactive=64)
            self.attached.append(fn)
        for event, fn in (("iounmap", "on_iounmap"), (MMIOTNG_HOOK_SYMBOL, "on_access"),
                          (MMIOTNG_MARK_HOOK_SYMBOL, "on_mark")):
            try:
                b.attach_kprobe(event=event, fn_name=fn)
            except Exception as exc:
                raise LoaderError(f"cannot attach a kprobe to {event}: {exc}") from exc
            self.attached.append(event)

    def _on_record(self, ctx: int, data: int, size: int) -> int:
        self._records.append(ctypes.string_at(data, size))
        # libbpf keeps reading while records keep coming: under a sustained
        # burst it would never return.  A negative result ends this poll
        # (the record is kept), so output and signals are seen in time.
        return -1 if len(self._records) >= BATCH else 0

    def poll(self, timeout_ms: int) -> list[bytes]:
        """Records available within timeout_ms, oldest first."""
        self.bpf.ring_buffer_poll(timeout_ms)
        out, self._records = self._records, []
        return out

    def drain(self) -> list[bytes]:
        """What the ring buffer holds now (at most about one buffer's worth,
        so that a producer that goes on cannot keep this from returning)."""
        out: list[bytes] = []
        limit = self.buffer_bytes // 16
        while len(out) < limit:
            self.bpf.ring_buffer_consume()
            if not self._records:
                break
            out += self._records
            self._records = []
        return out

    def drops(self) -> tuple[int, int]:
        """(records dropped in all, dropped but not yet reported in a record)."""
        table = self.bpf["drops"]
        total = sum(table[ctypes.c_int(0)])
        pending = sum(table[ctypes.c_int(1)])
        return int(total), int(pending)

    def add_mapping(self, virt: int) -> int:
        """Give a mapping armed by the loader a map id, as on_ioremap_return does."""
        ctr = self.bpf["next_map_id"]
        key = ctypes.c_int(0)
        map_id = ctr[key].value + 1
        ctr[key] = ctypes.c_uint(map_id)
        self.bpf["map_ids"][ctypes.c_ulonglong(virt)] = ctypes.c_int(map_id)
        return map_id

    def close(self) -> None:
        self.bpf.cleanup()


def monotonic_ns() -> int:
    """The clock of bpf_ktime_get_ns()."""
    return time.monotonic_ns()
