"""SQL from ``sql/`` made ready for one backend: identifiers filled in, dialect transpiled."""

from __future__ import annotations

from functools import cache

import sqlglot
from changewatch import sql

__all__ = ["literal", "quote", "render"]


def quote(identifier: str) -> str:
    """A double-quoted identifier, valid in both PostgreSQL and DuckDB.

    >>> quote("issues"), quote('we"ird')
    ('"issues"', '"we""ird"')
    """
    return '"' + identifier.replace('"', '""') + '"'


def literal(text: str) -> str:
    """A single-quoted string literal, for the few statements that take no parameters.

    >>> literal("it's.duckdb")
    "'it''s.duckdb'"
    """
    return "'" + text.replace("'", "''") + "'"


def render(name: str, dialect: str, **fragments: str) -> str:
    """Statement ``sql/<name>.sql`` for ``dialect`` with ``{placeholders}`` replaced.

    Fragments are SQL text built by the caller from quoted identifiers only; values are never
    formatted in, they travel as ``$n`` parameters.
    """
    return _render(name, dialect, tuple(sorted(fragments.items())))


@cache
def _render(name: str, dialect: str, fragments: tuple[tuple[str, str], ...]) -> str:
    text = sql.load(name).format(**dict(fragments))
    if dialect == "postgres":
        return text
    (statement,) = sqlglot.transpile(text, read="postgres", write=dialect)
    return statement
