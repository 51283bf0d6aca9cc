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
# (junit of the run at e27042d), less the BPF compile of each part's first
# test (test_all.py's and test_diff.py's, about 140 and 120 s then): each
# part pays it once, whichever file comes first
SECONDS = {
    "test_all.py": 66,
    "test_analysis.py": 39,
    "test_cli_errors.py": 41,
    "test_commands.py": 41,
    "test_diff.py": 119,
    "test_engine_safety.py": 335,
    "test_fields.py": 35,
    "test_flight.py": 0,               # its boot only
    "test_helper_version.py": 27,
    "test_histogram.py": 19,
    "test_install.py": 110,
    "test_irq.py": 47,
    "test_kernel_reference.py": 31,
    "test_ksym.py": 235,
    "test_large_bars.py": 44,
    "test_lockdown.py": 0,             # its boot only
    "test_lockdown_integrity.py": 0,   # its boot only
    "test_memtype.py": 9,
    "test_ng_trace.py": 127,
    "test_output.py": 39,
    "test_record.py": 166,
    "test_reliability.py": 147,
    "test_replay.py": 10,
    "test_session_owner.py": 5,
    "test_singlestep.py": 12,
    "test_small_bars.py": 44,
    "test_storm.py": 26,
    "test_switches.py": 54,
    "test_truth.py": 52,
    "test_unplug.py": 10,
}
# tests/run's short boots (single-threaded TCG, signatures enforced,
# lockdown) run after the last part, beside the others: their seconds, boots
# included, count as that part's from the start
AFTER_LAST = 200.0
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
