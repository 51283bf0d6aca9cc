"""Where `export --parquet` puts its tables: a Parquet file per table in one
directory.  Nothing heavy is imported here: a reader tells an export from a
trace with it before it knows whether it needs pyarrow."""

from __future__ import annotations

import os
from typing import Final

TABLES: Final = ("records", "devices", "mappings")
SUFFIX: Final = ".parquet"


def table_files(directory: str) -> dict[str, str] | None:
    """The Parquet files of an export: table name -> path; None if it has
    no records.parquet (devices and mappings may be missing: empty)."""
    files = {t: os.path.join(directory, t + SUFFIX) for t in TABLES}
    return files if os.path.isfile(files["records"]) else None
