"""tests/vm/tcg-int3: the module builds with zero warnings (W=1) and is
checkpatch-clean; the reproducer's reading of QEMU's answers (exception
log, memory dump) and its verdict, on canned answers."""

from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
from ng_require import missing

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "tests" / "vm" / "tcg-int3"
KERNELS = sorted(Path(p).parent.name for p in glob.glob("/lib/modules/*/build"))


def load_reproduce():
    loader = importlib.machinery.SourceFileLoader("tcg_int3_reproduce", str(HERE / "reproduce"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


rep = load_reproduce()


@pytest.mark.parametrize("kver", KERNELS or ["none"])
def test_builds_without_warnings(kver, tmp_path):
    kdir = Path("/lib/modules") / kver / "build"
    if not kdir.is_dir():
        missing("no kernel headers (linux-headers-amd64)")
    work = tmp_path / "tcg-int3"
    shutil.copytree(HERE, work, ignore=shutil.ignore_patterns("*.o", "*.ko", "*.mod*", ".*"))
    out = subprocess.run(["make", "-C", str(kdir), f"M={work}", "W=1", "modules"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    warnings = [ln for ln in (out.stdout + out.stderr).splitlines() if "warning:" in ln]
    assert not warnings, "\n".join(warnings)
    assert (work / "tcg_int3.ko").exists()


def test_checkpatch_clean(kernel_source):
    out = subprocess.run(["perl", str(kernel_source / "scripts" / "checkpatch.pl"), "--no-tree",
                          "--strict", "--ignore", "SPDX_LICENSE_TAG,FILE_PATH_CHANGES", "-f",
                          str(HERE / "tcg_int3.c")], capture_output=True, text=True)
    assert "total: 0 errors, 0 warnings, 0 checks" in out.stdout, out.stdout


def test_help():
    out = subprocess.run([str(HERE / "reproduce"), "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for opt in ("--modes", "--rounds", "--timeout", "--kprobes-optimization", "Exit status"):
        assert opt in out.stdout


ADDR = "ffffffff96dc35e0"
BP = f"  1234: v=03 e=0000 i=1 cpl=0 IP=0010:{ADDR} pc={ADDR[:-1]}1 SP=0018:ff6d63040044bb48\n"
TIMER = "  1235: v=ec e=0000 i=0 cpl=0 IP=0010:ffffffff97800ba0 pc=ffffffff97800ba0 SP=0018:0\n"


class FakeQmp:
    """QEMU's answers: `log int,tid` makes vCPU 1's thread log N #BPs at
    ADDR and vCPU 0's a timer interrupt; `x` shows BYTES."""

    def __init__(self, logs: dict[int, Path], n: int, first: int) -> None:
        self.logs, self.n, self.first = logs, n, first

    def hmp(self, line: str, cpu: int | None = None) -> str:
        if line == "log int,tid":
            with open(self.logs[1], "a") as fh:
                fh.write((BP + "RAX=0 RBX=0\n") * self.n)
            with open(self.logs[0], "a") as fh:
                fh.write(TIMER)
        elif line.startswith("x /16xb"):
            b = [self.first, 0x57, 0x41, 0x56, 0x41, 0x55, 0x41, 0x54,
                 0x55, 0x53, 0x48, 0x83, 0xec, 0x10, 0x8b, 0x0d]
            return "".join(f"{line.split()[-1][2:]}: " + " ".join(f"0x{x:02x}" for x in row)
                           + "\r\n" for row in (b[:8], b[8:]))
        return ""


def test_exception_windows_and_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(rep.time, "sleep", lambda s: None)
    logs = {0: tmp_path / "int-0.log", 1: tmp_path / "int-1.log"}
    logs[1].write_text(BP * 5)      # before the window: not counted
    qmp = FakeQmp(logs, 7, 0x41)
    seen = rep.int_window(qmp, logs, 1.0)
    assert seen[1] == {("03", 0, ADDR): 7}
    assert seen[0] == {("ec", 0, "ffffffff97800ba0"): 1}
    assert rep.memory_bytes(qmp, 1, ADDR)[:3] == [0x41, 0x57, 0x41]
    assert len(rep.memory_bytes(qmp, 1, ADDR)) == 16


def hang_result(first_byte: int, second_window: list) -> dict:
    return {"mode": "tcg", "result": "hang", "hang_round": 3, "started": 10.0,
            "what": "rmmod did not return in 30 s", "writer": "stopped", "writes": 9,
            "symbol": ADDR,
            "evidence": {"bp": [{0: [], 1: [(7, ADDR)]}, {0: [], 1: second_window}],
                         "all_vectors": [{0: {}, 1: {"03": 7}}, {0: {}, 1: {"03": 7}}],
                         "rip_samples": [{0: "ffffffff97800ba0", 1: ADDR}],
                         "bp_ip": ADDR, "bytes": [first_byte] + [0] * 15,
                         "window": 1.0, "recheck": 10.0}}


def test_verdict(capsys):
    assert rep.summary(hang_result(0x41, [(9, ADDR)]))
    assert "(tracing_mark_write+0x0)" in capsys.readouterr().out
    assert not rep.summary(hang_result(0xCC, [(9, ADDR)]))       # the int3 is still there
    assert not rep.summary(hang_result(0x41, []))                # no #BP the second time
    done = {"mode": "tcg-single", "result": "completed", "rounds": 50, "elapsed": 89.0}
    assert rep.summary(done)
    assert not rep.summary(dict(done, mode="tcg"))
