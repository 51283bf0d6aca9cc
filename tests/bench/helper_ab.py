#!/usr/bin/env python3
"""Two builds of the helper module side by side in one guest boot: the
helper alone (no BPF program) in its trap-only floor and emulate modes,
rloop and wloop, the builds in turn for ROUNDS rounds; the median ns per
access of each, and what emulation adds above the floor.  For a change to
the fault path: build the module before the change somewhere else (a git
worktree), then, in the test VM (tests/vm/run --qemu '-device edu' -- ...):

    .venv/bin/python tests/bench/helper_ab.py OLD.ko NEW.ko

Progress on stderr (guest_bench's), the table on stdout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guest_bench as gb  # noqa: E402

COUNTS = {"rloop": 50_000, "wloop": 50_000}
MODES = {"ng_trap_only": "TRAP_ONLY", "ng_helper_emulate": "EMULATE"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, help="the helper module before the change (.ko)")
    ap.add_argument("new", type=Path, help="the helper module after it (.ko)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    kos = {"before": args.old, "after": args.new}
    for ko in kos.values():
        if not ko.is_file():
            ap.error(f"{ko}: no such module")
    gb.HELPER_MODES = MODES
    gb.load_exerciser()
    bdf = gb.find_edu()
    runs: dict[str, dict[tuple[str, str], list[float]]] = {k: {} for k in kos}
    for _ in range(args.rounds):
        for name, ko in kos.items():
            gb.HELPER_KO = ko
            res: dict = {}
            gb.helper_breakdown(res, bdf, COUNTS)
            for mode in MODES:
                for scenario, v in res[mode].items():
                    runs[name].setdefault((mode, scenario), []).append(v["ns_per_access"])
    print("| | trap-only floor | helper emulate | above the floor |")
    print("|---|---:|---:|---:|")
    for scenario in COUNTS:
        for name in kos:
            floor = statistics.median(runs[name][("ng_trap_only", scenario)])
            emu = statistics.median(runs[name][("ng_helper_emulate", scenario)])
            print(f"| {scenario}, {name} | {floor:.0f} | {emu:.0f} | {emu - floor:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
