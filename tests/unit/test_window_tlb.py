"""The rule of kmod/ng_window_tlb.h against a model of a PCID-tagged TLB
(tests/unit/window_tlb_model.c): with PTI, kernel entries are not global and
invlpg drops only the current PCID's; QEMU's TCG flushes at every CR3 write,
so no guest shows a stale window translation, and this model stands in."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ng_require import missing

REPO = Path(__file__).resolve().parents[2]
SRC = Path(__file__).with_name("window_tlb_model.c")


def build(tmp_path: Path, *defines: str) -> Path:
    if not shutil.which("gcc"):
        missing("no gcc")
    out = tmp_path / ("model" + "".join(defines))
    subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", "-O2", f"-I{REPO / 'kmod'}",
                    *(f"-D{d}" for d in defines), "-o", str(out), str(SRC)], check=True)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_window_never_translates_to_another_page(tmp_path, seed):
    res = subprocess.run([str(build(tmp_path)), "300000", str(seed)],
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == "ok 300000\n", res.stdout


def test_model_catches_the_rule_that_ignores_the_pcid(tmp_path):
    """The earlier rule (flush only when the entry changes): the model must
    find a stale translation, or it could not catch anything."""
    res = subprocess.run([str(build(tmp_path, "NG_RULE_ENTRY_ONLY")), "300000", "1"],
                         capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout.startswith("stale "), res.stdout
