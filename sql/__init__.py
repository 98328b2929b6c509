"""The project's SQL, one statement per file, written once in PostgreSQL syntax.

Files are named ``<verb>_<table>.sql``. ``{name}`` placeholders stand for identifiers (table and
column names from config), filled in already quoted by ``warehouse.statements``; values always
travel as ``$n`` parameters. DuckDB gets the same text transpiled by sqlglot.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

__all__ = ["load"]


@cache
def load(name: str) -> str:
    """Text of ``sql/<name>.sql``.

    >>> load("create_sync_state").startswith("--")
    True
    """
    return files(__package__).joinpath(f"{name}.sql").read_text(encoding="utf-8")
