"""How the main boot's guest tests are split between guests that run side by
side (tests/run: ``pytest --shard K/N``).

Measured on a two-core host: one guest with all of them took 1519 s of
tests (1956 s for the whole tests/run); two side by side took 1322 s and
1340 s (1805 s in all).  Each test takes about twice as long beside the
other guest (a guest keeps 1.1-1.9 host cores busy, and four vCPU threads
on two cores wait on each other), so the split gains about a tenth, not a
half; on more cores the two run apart.  The split is by file (a
file's module fixtures are made once), balanced by what each file took in
the main boot (SECONDS, from a full run's junit file); a file not listed
counts DEFAULT_SECONDS until it is (tests/unit/test_guest_shards.py fails
for it).
"""

from __future__ import annotations

# seconds each file's tests took in the main boot of a full run, side by side
# (junit of the run at c1c45d8; test_record and test_diff less the copies'
# share, 60 and 15 s, made 4x faster after it)
SECONDS = {
    "test_all.py": 134,
    "test_analysis.py": 46,
    "test_cli_errors.py": 41,
    "test_commands.py": 37,
    "test_diff.py": 161,
    "test_engine_safety.py": 351,
    "test_fields.py": 37,
    "test_helper_version.py": 26,
    "test_histogram.py": 22,
    "test_install.py": 95,
    "test_kernel_reference.py": 33,
    "test_irq.py": 120,                # new: 67 s alone, twice that beside the other
    "test_ksym.py": 271,
    "test_large_bars.py": 44,
    "test_lockdown.py": 0,             # its boot only
    "test_lockdown_integrity.py": 0,   # its boot only
    "test_memtype.py": 9,
    "test_ng_trace.py": 138,
    "test_output.py": 38,
    "test_record.py": 247,
    "test_reliability.py": 170,
    "test_replay.py": 25,
    "test_session_owner.py": 7,
    "test_singlestep.py": 8,
    "test_small_bars.py": 55,
    "test_storm.py": 27,
    "test_switches.py": 29,
    "test_truth.py": 51,
    "test_unplug.py": 17,
}
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
    """Each file name -> its shard, 1..n: the longest files first, each to
    the shard with the least time so far (ties to the lower shard), so the
    same files always split the same way."""
    load = [0.0] * n
    out: dict[str, int] = {}
    for name in sorted(set(files), key=lambda f: (-SECONDS.get(f, DEFAULT_SECONDS), f)):
        i = min(range(n), key=lambda s: (load[s], s))
        out[name] = i + 1
        load[i] += SECONDS.get(name, DEFAULT_SECONDS)
    return out
