"""Host checks of the loader's helpers that need no BPF."""

from __future__ import annotations

from mmiotrace_ng.loader import kernel_functions


def test_kernel_functions_finds_text_symbols_only() -> None:
    got = kernel_functions(("ioremap", "iounmap", "no_such_function_ng", "jiffies"))
    # jiffies is data (D), not text; the order of the request is kept
    assert got == ["ioremap", "iounmap"]


def test_too_many_ranges_refused_before_anything_is_loaded(tmp_path) -> None:
    import pytest

    from mmiotrace_ng.loader import LoaderError, Probes, Ranges
    from mmiotrace_ng.records import NG_MAX_RANGES

    many = Ranges([(0x1000 * i, 0x1000 * i + 0x100) for i in range(NG_MAX_RANGES + 1)])
    with pytest.raises(LoaderError, match=f"at most {NG_MAX_RANGES}"):
        Probes(many, 16384, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
