"""The split of the main boot's guest tests between the guests tests/run runs
side by side (tests/guest/shards.py, ``pytest --shard K/N``): every test in
exactly one part, the parts about as long, every file's time known."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUEST = ROOT / "tests" / "guest"
sys.path.insert(0, str(GUEST))
import shards  # noqa: E402


def _collect(*args: str) -> list[str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only",
                          "-p", "no:cacheprovider", *args, "tests/guest"],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return [line for line in res.stdout.splitlines() if "::" in line]


def test_every_guest_test_file_has_its_time():
    files = sorted(p.name for p in GUEST.glob("test_*.py"))
    missing = [f for f in files if f not in shards.SECONDS]
    assert not missing, f"add to SECONDS in tests/guest/shards.py: {missing}"
    gone = [f for f in shards.SECONDS if f not in files]
    assert not gone, f"no such guest test files: {gone}"


def test_two_shards_are_the_whole_suite_once():
    whole = _collect()
    one, two = _collect("--shard", "1/2"), _collect("--shard", "2/2")
    assert one and two
    assert not set(one) & set(two)
    assert sorted(one + two) == sorted(whole)
    # and a marker selection (tests/run's) splits the same way
    sel = ("-m", "not single_tcg and not second_boot and not oops")
    assert sorted(_collect(*sel, "--shard", "1/2") + _collect(*sel, "--shard", "2/2")) \
        == sorted(_collect(*sel))


def test_the_two_parts_are_about_as_long():
    """With the short boots after the second (tests/run)."""
    part = shards.assign(list(shards.SECONDS), 2)
    load = [sum(s for f, s in shards.SECONDS.items() if part[f] == k) for k in (1, 2)]
    load[1] += shards.AFTER_LAST
    # greedy longest-first: the parts differ by at most the longest file
    assert abs(load[0] - load[1]) <= max(shards.SECONDS.values())
    assert abs(load[0] - load[1]) <= 0.05 * sum(load), load


def test_pinned_files_are_in_their_part():
    for n in (2, 3):
        part = shards.assign(list(shards.SECONDS), n)
        assert all(part[f] == min(k, n) for f, k in shards.PINNED.items())
    assert shards.assign(list(shards.SECONDS), 1) == dict.fromkeys(shards.SECONDS, 1)


def test_a_file_not_listed_still_runs_in_one_part():
    # the long files fill the first part past the short boots' AFTER_LAST
    # seconds: the new one, at DEFAULT_SECONDS, goes to the second
    part = shards.assign(["test_new.py", "test_ksym.py", "test_engine_safety.py"], 2)
    assert part == {"test_engine_safety.py": 1, "test_ksym.py": 1, "test_new.py": 2}


@pytest.mark.parametrize("spec", ["", "2", "0/2", "3/2", "a/b", "1/0", "-1/2"])
def test_bad_shard_specs_are_refused(spec):
    with pytest.raises(ValueError):
        shards.parse(spec)


def test_a_bad_shard_is_a_usage_error():
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only",
                          "-p", "no:cacheprovider", "--shard", "3/2", "tests/guest"],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert res.returncode == 4, res.stdout + res.stderr
    assert "--shard 3/2: K must be 1 to N" in res.stderr
