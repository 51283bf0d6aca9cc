"""The helper's files form layers: no file calls a function of a file that
calls back into it, directly or through others (mmiotng.h lists the files
and their jobs)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KMOD = REPO / "kmod"
# a definition at the start of a line: return type, name, parameters
DEFINITION = re.compile(r"^(static\s+)?[a-z][^\n;=(]*?\b(ng_\w+)\(", re.M)


def code(text: str) -> str:
    """The C text without comments and string contents."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def call_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """File -> the files whose non-static functions it names."""
    owner: dict[str, str] = {}
    own_static: dict[str, set[str]] = {}
    for name, text in sources.items():
        own_static[name] = set()
        for m in DEFINITION.finditer(text):
            if m.group(1):
                own_static[name].add(m.group(2))
            else:
                owner.setdefault(m.group(2), name)
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, text in sources.items():
        used = set(re.findall(r"\b(ng_\w+)\b", text)) - own_static[name]
        graph[name] = {owner[f] for f in used if f in owner and owner[f] != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def kmod_sources() -> dict[str, str]:
    return {p.name: code(p.read_text()) for p in sorted(KMOD.glob("*.c"))
            if not p.name.endswith(".mod.c")}


def test_the_helpers_files_call_each_other_without_cycles():
    graph = call_graph(kmod_sources())
    assert len(graph) >= 10, sorted(graph)
    assert cycles(graph) == [], {f: sorted(graph[f]) for f in graph}


def test_a_cycle_is_found():
    """The check itself: two files that call each other, a third that calls
    one of them, and a static function named like another file's."""
    sources = {
        "a.c": "int ng_a(void)\n{\n\treturn ng_b();\n}\n",
        "b.c": "int ng_b(void)\n{\n\treturn ng_a();\n}\n",
        "c.c": "static int ng_a_too(void)\n{\n\treturn ng_b();\n}\n",
        "d.c": "static int ng_c(void)\n{\n\treturn 0;\n}\nint ng_d(void)\n{\n\treturn ng_c();\n}\n",
        "e.c": "int ng_c(void)\n{\n\treturn ng_d();\n}\n",
    }
    graph = call_graph({k: code(v) for k, v in sources.items()})
    assert graph == {"a.c": {"b.c"}, "b.c": {"a.c"}, "c.c": {"b.c"}, "d.c": set(),
                     "e.c": {"d.c"}}
    assert cycles(graph) == [["a.c", "b.c"]]

