"""Host checks of the loader's helpers that need no BPF."""

from __future__ import annotations

import pytest

from mmiotrace_ng.tracer.loader import kernel_functions


def test_kernel_functions_finds_text_symbols_only() -> None:
    got = kernel_functions(("ioremap", "iounmap", "no_such_function_ng", "jiffies"))
    # jiffies is data (D), not text; the order of the request is kept
    assert got == ["ioremap", "iounmap"]


def test_prefetch_hands_over_its_result_error_and_message(monkeypatch, capsys, tmp_path) -> None:
    import time

    from mmiotrace_ng.common import bpfload as loader

    calls = []

    def fake(source, programs, cache_dir, on_compile):
        calls.append(source)
        if source.name == "bad.c":
            raise loader.LoaderError("cannot compile")
        on_compile()
        time.sleep(0.5)
        return "object", False

    monkeypatch.setattr(loader, "_compiled", fake)
    good, bad = tmp_path / "good.c", tmp_path / "bad.c"
    loader.prefetch(good, (), cache_dir=None)
    loader.prefetch(good, (), cache_dir=None)           # once only
    assert loader.compiled(good, (), None) == ("object", False)
    assert "compiling the BPF programs" in capsys.readouterr().err
    assert calls == [good]
    loader.prefetch(bad, (), cache_dir=None)
    with pytest.raises(loader.LoaderError, match="cannot compile"):
        loader.compiled(bad, (), None)
    # without a prefetch: compiled in place
    assert loader.compiled(good, (), None) == ("object", False)
    assert calls == [good, bad, good]
