"""symsnap: a recording's symbols keep the modules unloaded while tracing."""

from __future__ import annotations

from mmiotrace_ng.format import symsnap

KERNEL = "ffffffff81000000 T _stext\nffffffff81001000 T do_one\n"


def lines(mod: str, base: int) -> str:
    return (f"{base:x} t {mod}_probe\t[{mod}]\n{base + 0x100:x} t {mod}_read\t[{mod}]\n")


def row(mod: str, base: int) -> str:
    return f"{mod} 16384 0 - Live 0x{base:x}\n"


def test_a_module_gone_before_the_end_keeps_its_symbols(tmp_path, monkeypatch):
    kallsyms, modules = tmp_path / "kallsyms", tmp_path / "modules"
    monkeypatch.setattr(symsnap, "KALLSYMS", kallsyms)
    monkeypatch.setattr(symsnap, "MODULES", modules)
    # at the start: old is loaded (and will go), keep is loaded (and stays)
    kallsyms.write_text(KERNEL + lines("old", 0xC0000000) + lines("keep", 0xC0100000))
    modules.write_text(row("old", 0xC0000000) + row("keep", 0xC0100000))
    snap = symsnap.SymbolSnapshots()
    snap._thread.join()         # the snapshot of the start
    # new comes, is seen by a poll, and goes again; old goes too
    kallsyms.write_text(KERNEL + lines("keep", 0xC0100000) + lines("new", 0xC0200000))
    modules.write_text(row("keep", 0xC0100000) + row("new", 0xC0200000))
    snap._next = 0
    snap.poll()
    snap._thread.join()
    kallsyms.write_text(KERNEL + lines("keep", 0xC0100000) + lines("late", 0xC0300000))
    modules.write_text(row("keep", 0xC0100000) + row("late", 0xC0300000))
    text, mods = snap.final()
    want = (KERNEL + lines("keep", 0xC0100000) + lines("late", 0xC0300000)
            + lines("new", 0xC0200000) + lines("old", 0xC0000000))
    assert text == want
    assert mods == (row("keep", 0xC0100000) + row("late", 0xC0300000)
                    + row("new", 0xC0200000) + row("old", 0xC0000000))
    # a module seen and still loaded is not repeated; one never seen loaded
    # (late: came after the last poll) is in the final text anyway


def test_nothing_readable(tmp_path, monkeypatch):
    monkeypatch.setattr(symsnap, "KALLSYMS", tmp_path / "none")
    monkeypatch.setattr(symsnap, "MODULES", tmp_path / "none2")
    snap = symsnap.SymbolSnapshots()
    snap._next = 0
    snap.poll()
    assert snap.final() == (None, None)
