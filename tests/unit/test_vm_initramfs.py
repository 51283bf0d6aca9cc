"""tests/vm/run's initramfs cache: two guests started together (the main
boot's two parts) that both find it missing each build it, and both boot."""

from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import os
import threading
from pathlib import Path

from ng_require import missing

RUN = Path(__file__).resolve().parents[2] / "tests" / "vm" / "run"
KVER = os.environ.get("MMIOTNG_KVER", "6.1.0-57-amd64")


def load_run():
    loader = importlib.machinery.SourceFileLoader("vm_run", str(RUN))
    spec = importlib.util.spec_from_loader("vm_run", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_two_builds_at_once_both_get_a_whole_initramfs(tmp_path, monkeypatch):
    if not Path(f"/lib/modules/{KVER}/modules.dep").exists():
        missing(f"the modules of {KVER} (linux-image-{KVER})")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    run = load_run()
    results: list[Path | BaseException] = []
    start = threading.Barrier(4)

    def build() -> None:
        start.wait()
        try:
            results.append(run.build_initramfs(Path("/"), KVER))
        except BaseException as exc:        # SystemExit from die() included
            results.append(exc)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, Path) for r in results), results
    (out,) = set(results)
    cache = tmp_path / "mmiotrace-ng" / "vm"
    assert sorted(p.name for p in cache.iterdir()) == [out.name]     # no temporary left
    data = gzip.decompress(out.read_bytes())
    assert data.startswith(b"070701") and b"TRAILER!!!" in data      # a whole newc cpio
    assert b"9pnet_virtio.ko" in data
