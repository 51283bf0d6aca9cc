"""How the main boot's guest tests are split between guests that run side by
side (tests/run: ``pytest --shard K/N``).

Measured on a two-core host: one guest with all of them took 1519 s of
tests (1956 s for the whole tests/run); two side by side took 1322 s and
1340 s (1805 s in all).  Each test takes about twice as long beside the
other guest (a guest keeps 1.1-1.9 host cores busy, and four vCPU threads
on two cores wait on each other), so the split gains about a tenth, not a
half; on more cores the two run apart.  The split is by file (a
file's module fixtures are made once), balanced by what each file took in
the main boot (SECONDS, from a full run's junit file) and by the short
boots that follow the last part (AFTER_LAST); a file not listed counts
DEFAULT_SECONDS until it is (tests/unit/test_guest_shards.py fails for it).
"""

from __future__ import annotations

# seconds each file's tests took in the main boot of a full run, side by side
# (junit of the clean-clone CI run at edc04b1; the BPF objects a part's first
# test compiled took 20-40 s of it there, under the first file's name)
SECONDS = {
    "test_all.py": 100,
    "test_analysis.py": 28,
    "test_cli_errors.py": 44,
    "test_commands.py": 22,
    "test_diff.py": 111,
    "test_engine_safety.py": 273,  # + the kprobe test (about 55 s alone)
    "test_fields.py": 30,
    "test_flight.py": 0,  # its boot only
    "test_helper_version.py": 32,
    "test_histogram.py": 17,
    "test_install.py": 54,
    "test_irq.py": 43,
    "test_kernel_reference.py": 28,
    "test_ksym.py": 225,
    "test_large_bars.py": 60,
    "test_lockdown.py": 0,  # its boot only
    "test_lockdown_integrity.py": 0,  # its boot only
    "test_memtype.py": 14,
    "test_ng_trace.py": 100,
    "test_output.py": 35,
    "test_record.py": 182,
    "test_reliability.py": 167,
    "test_replay.py": 28,
    "test_session_owner.py": 10,
    "test_singlestep.py": 17,
    "test_small_bars.py": 58,
    "test_storm.py": 23,
    "test_switches.py": 47,
    "test_truth.py": 46,
    "test_unplug.py": 23,
    "test_user_maps.py": 32,
    "test_user_trace.py": 160,  # 113 there, with 5 tests added since (about 14 s each)
}
# tests/run's short boots (single-threaded TCG, signatures enforced,
# lockdown, then the flight recorder's boot) run after the last part, beside
# the others: their seconds, boots included, count as that part's from the
# start (at e56155d: 189 s for the three short boots, 129 s for the flight
# recorder's; the last part's chain then ended 171 s after the first part)
AFTER_LAST = 320.0
# files that must be in a part: test_diff.py's e1000 recording is what the
# second boot (after the last part) compares with
PINNED = {"test_diff.py": 2}
DEFAULT_SECONDS = 10.0


def parse(spec: str) -> tuple[int, int]:
    """'K/N' -> (K, N), 1 <= K <= N; ValueError otherwise."""
    k_text, sep, n_text = spec.partition("/")
    if not sep or not k_text.isdigit() or not n_text.isdigit():
        raise ValueError(f"--shard wants K/N (e.g. 1/2), not {spec!r}")
    k, n = int(k_text), int(n_text)
    if not 1 <= k <= n:
        raise ValueError(f"--shard {spec}: K must be 1 to N")
    return k, n


def assign(files: list[str], n: int) -> dict[str, int]:
    """Each file name -> its shard, 1..n: the pinned files to theirs (the
    last if there are fewer), then the longest files first, each to the
    shard with the least time so far (ties to the lower shard), so the
    same files always split the same way.  The last shard starts with
    AFTER_LAST seconds when there are several."""
    load = [0.0] * n
    if n > 1:
        load[-1] = AFTER_LAST
    out: dict[str, int] = {}
    names = sorted(set(files), key=lambda f: (f not in PINNED, -SECONDS.get(f, DEFAULT_SECONDS), f))
    for name in names:
        if name in PINNED:
            i = min(PINNED[name], n) - 1
        else:
            i = min(range(n), key=lambda s: (load[s], s))
        out[name] = i + 1
        load[i] += SECONDS.get(name, DEFAULT_SECONDS)
    return out
