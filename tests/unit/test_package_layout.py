"""The package's groups in layers (docs/how-it-works.md): common/ below
format/, both below the live tracer (tracer/) and the analysis tools
(analysis/), which do not use each other; ksym/ uses common/ only; the
command line at the top may use them all, and nothing below uses it;
replay (a trace played back to a device) stands beside the analysis tools
and uses the PCI addresses of tracer/."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "mmiotrace_ng"
ALLOWED = {
    "common": set(),
    "format": {"common"},
    "tracer": {"common", "format"},
    "analysis": {"common", "format"},
    "ksym": {"common"},
    "replay": {"common", "format", "analysis", "tracer"},
}


def imported_groups(path: Path) -> set[str]:
    """The package groups (or "top" for a top-level module) a module
    imports, relative or absolute, anywhere in it (imports inside
    functions included)."""
    group = path.parent.name
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if node.level == 1:
                parts = [group, *(node.module.split(".") if node.module else [])]
            else:
                parts = node.module.split(".") if node.module else []
            names = [a.name for a in node.names]
        elif node.module and node.module.split(".")[0] == "mmiotrace_ng":
            parts = node.module.split(".")[1:]
            names = [a.name for a in node.names]
        else:
            continue
        if not parts:       # from .. import x: x a group, a module or the version
            found |= {n if n in ALLOWED else "top" for n in names if n != "__version__"}
        else:
            found.add(parts[0] if parts[0] in ALLOWED else "top")
    return found - {group}


def test_each_group_uses_only_the_groups_below_it():
    seen = {}
    for group in ALLOWED:
        for path in sorted((PKG / group).glob("*.py")):
            extra = imported_groups(path) - ALLOWED[group]
            assert not extra, f"{path.relative_to(PKG)} uses {sorted(extra)}"
            seen[group] = seen.get(group, 0) + 1
    assert set(seen) == set(ALLOWED) and sum(seen.values()) >= 30, seen


def test_a_wrong_import_is_found(tmp_path):
    """The check itself: an analysis module that uses the tracer, and one
    that uses the command line, each found; the version and a sibling are
    not."""
    mod = tmp_path / "analysis" / "m.py"
    mod.parent.mkdir()
    mod.write_text("from .. import __version__\nfrom .tracefile import Trace\n"
                   "def f():\n    from ..tracer.netlink import HelperSocket\n")
    assert imported_groups(mod) == {"tracer"}
    mod.write_text("from mmiotrace_ng.cli import main\nfrom ..format import records\n")
    assert imported_groups(mod) == {"top", "format"}


def test_every_import_of_the_package_names_a_module_that_exists():
    """Imports made inside functions too (they run only when used: a trace
    imports some only once it records)."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if "data" in path.relative_to(PKG).parts:
            continue
        package = ".".join(path.relative_to(PKG.parent).parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "mmiotrace_ng":
                module = node.module
            else:
                continue
            if not _exists(module):
                bad.append(f"{path.relative_to(PKG)}:{node.lineno} {module}")
                continue
            for alias in node.names:     # from PKG import submodule
                sub = f"{module}.{alias.name}"
                spec = importlib.util.find_spec(module)
                if spec.submodule_search_locations and alias.name != "*" and \
                        not _exists(sub) and \
                        not _defines(module, alias.name):
                    bad.append(f"{path.relative_to(PKG)}:{node.lineno} {sub}")
    assert bad == []


def _defines(package: str, name: str) -> bool:
    """Whether a package's __init__ defines name (e.g. __version__)."""
    init = PKG.parent.joinpath(*package.split("."), "__init__.py")
    return name in init.read_text()


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:     # a package on its path is missing
        return False
