"""The optional Python packages of export --parquet and query (the [sql]
extra): whether they are here, and if not, one line that says what to
install, where the distribution has a package of it and where only PyPI
does (Debian packages pyarrow from sid on, DuckDB's Python module not at
all)."""

from __future__ import annotations

from importlib import import_module
from typing import Final

from ..common.errors import UsageError

EXTRA: Final = "pip install 'mmiotrace-ng[sql]'"
# module -> the Debian (and Ubuntu) package that has it, None if none does
DEBIAN: Final[dict[str, str | None]] = {
    "pyarrow": "python3-pyarrow",
    "numpy": "python3-numpy",
    "duckdb": None,
}
# where the packages are: pyarrow's from Debian sid and Ubuntu 26.04 on
NEWEST: Final = "python3-pyarrow"


def absent(modules: tuple[str, ...]) -> list[str]:
    """The modules of these that cannot be imported."""
    out = []
    for name in modules:
        try:
            import_module(name)
        except ImportError:
            out.append(name)
    return out


def message(command: str, missing: list[str]) -> str:
    """One line: what command needs and how to install it."""
    needs = " and ".join(missing)
    debs = [DEBIAN[m] for m in missing if DEBIAN.get(m)]
    if len(debs) == len(missing):
        where = "Debian sid, Ubuntu 26.04" if NEWEST in debs else "Debian, Ubuntu"
        return (f"{command} needs {needs}: install the distribution's package ({where}: "
                f"apt install {' '.join(debs)}) or {EXTRA}")
    nodeb = [m for m in missing if not DEBIAN.get(m)]
    return (f"{command} needs {needs}: {EXTRA} (no Debian package has the Python module "
            f"of {' or '.join(nodeb)})")


def require(command: str, modules: tuple[str, ...]) -> None:
    """UsageError (one line, exit 2) unless all the modules can be imported."""
    missing = absent(modules)
    if missing:
        raise UsageError(message(command, missing))
