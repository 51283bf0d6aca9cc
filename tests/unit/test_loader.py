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

    def fake(source, programs, cache_dir, on_compile, **kw):
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


def test_defines_are_asked_for_on_a_compile_only(monkeypatch, tmp_path) -> None:
    """The kernel's layout (BTF) is read when the object is compiled, never
    on a start that finds it in the cache; its flags reach the compiler."""
    from mmiotrace_ng.common import bpfload

    src = tmp_path / "x.bpf.c"
    src.write_text("int f(void) { return 0; }\n")
    monkeypatch.setattr(bpfload, "source_dir", lambda name: tmp_path)
    monkeypatch.setattr(bpfload, "bcc_version", lambda: "0")
    monkeypatch.setattr(bpfload, "_libbcc", lambda: None)
    seen: list[tuple[list[str], tuple[str, ...]]] = []

    def compile_object(source, cflags, programs, optional=()):
        seen.append((cflags, optional))
        return bpfload.BpfObject([], {"f": b"\x95" + bytes(7)}, "GPL", 0)

    monkeypatch.setattr(bpfload, "compile_object", compile_object)
    asked = []

    def defines() -> list[str]:
        asked.append(1)
        return ["-DNG_X=1"]

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    results = []
    for _ in range(2):
        obj, cached = bpfload._compiled(src, ("f",), cache, on_compile=lambda: None,
                                        optional=("g",), defines=defines)
        results.append((set(obj.progs), cached))
    assert results == [({"f"}, False), ({"f"}, True)]
    assert asked == [1]
    assert [(flags[-1], optional) for flags, optional in seen] == [("-DNG_X=1", ("g",))]


def test_interrupts_and_dma_without_their_programs_are_said_not_traced() -> None:
    """An object compiled where the kernel's BTF lacked the members the
    interrupt and DMA programs read has neither: each says so, and nothing
    is loaded or attached."""
    from mmiotrace_ng.common.bpfobj import BpfObject
    from mmiotrace_ng.tracer import loader

    assert set(loader.DMA_TRACEPOINTS) == set(loader.DMA_PROGRAMS)
    assert set(loader.IRQ_TRACEPOINTS) <= set(loader.IRQ_PROGRAMS)
    probes = object.__new__(loader.Probes)
    probes._obj = BpfObject([], {p: b"" for p in loader.BASE_PROGRAMS}, "GPL", 0)
    probes.attached = []
    irq = probes.trace_irqs(["0000:00:05.0"])
    dma = probes.trace_dma(["0000:00:05.0"])
    assert irq == [loader.NO_LAYOUT.format("interrupt", "interrupts are")]
    assert dma == [loader.NO_LAYOUT.format("DMA", "DMA mappings are")]
    assert "BTF" in irq[0] and probes.attached == []
