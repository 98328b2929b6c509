"""Warehouse URLs: the default, the DuckDB file one names, and one safe to print.

Standard library only: `changewatch info` says where the warehouse is without loading the
database drivers, polars or Arrow (which `changewatch.warehouse` itself imports).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["DEFAULT_URL", "WarehouseError", "describe_url", "duckdb_path", "is_postgres_url"]

DEFAULT_URL = "duckdb:///.changewatch/warehouse.duckdb"
POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg2://")
# libpq parameters that carry secrets; never shown.
_SECRET_PARAMS = {"password", "sslpassword", "passfile", "sslkey"}


class WarehouseError(Exception):
    """The warehouse URL is wrong or the warehouse refused a statement."""


def is_postgres_url(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL warehouse.

    >>> is_postgres_url("postgres://db/prod"), is_postgres_url("duckdb:///w.duckdb")
    (True, False)
    """
    return url.startswith(POSTGRES_SCHEMES)


def duckdb_path(url: str) -> Path:
    """File path of a DuckDB URL.

    >>> str(duckdb_path("duckdb:///data/w.duckdb")), str(duckdb_path("duckdb:////tmp/w.duckdb"))
    ('data/w.duckdb', '/tmp/w.duckdb')
    """
    if url.startswith("duckdb:///"):
        return Path(url[len("duckdb:///") :])
    if "://" in url:
        raise WarehouseError(
            f"unsupported warehouse URL scheme in {describe_url(url)!r}: "
            "use duckdb:///path.duckdb or postgresql://user@host/db"
        )
    return Path(url)


def describe_url(url: str) -> str:
    """The URL without its password, safe for logs and metadata.

    >>> describe_url("postgresql://app:s3cret@db:5432/prod?schema=cw")
    'postgresql://app@db:5432/prod?schema=cw'
    >>> describe_url("postgresql://app:s3cret@[::1]:5432/prod")
    'postgresql://app@[::1]:5432/prod'
    >>> describe_url("postgresql://app@db/prod?password=s3cret&sslmode=require")
    'postgresql://app@db/prod?sslmode=require'
    >>> describe_url("duckdb:////tmp/w.duckdb")
    'duckdb:////tmp/w.duckdb'
    """
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k.lower() not in _SECRET_PARAMS]
    if parts.password is None and len(query) == len(parse_qsl(parts.query)):
        return url  # nothing to hide: the URL as given
    parts = parts._replace(query=urlencode(query))
    if parts.password is None:
        return urlunsplit(parts)
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"  # an IPv6 address keeps its brackets
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))
