"""Host checks of the loader's helpers that need no BPF."""

from __future__ import annotations

from mmiotrace_ng.loader import kernel_functions


def test_kernel_functions_finds_text_symbols_only() -> None:
    got = kernel_functions(("ioremap", "iounmap", "no_such_function_ng", "jiffies"))
    # jiffies is data (D), not text; the order of the request is kept
    assert got == ["ioremap", "iounmap"]
