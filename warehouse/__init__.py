"""The warehouse: where synced tables, change logs and sync bookkeeping live.

DuckDB (a local file, the default) or PostgreSQL (when the URL says so), behind one small
interface; SQL comes from ``sql/`` and is transpiled per backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from changewatch.warehouse.urls import DEFAULT_URL, WarehouseError, describe_url

if TYPE_CHECKING:
    from changewatch.warehouse.backends import (
        DuckDBWarehouse,
        PostgresWarehouse,
        Warehouse,
        connect,
    )

__all__ = [
    "DEFAULT_URL",
    "DuckDBWarehouse",
    "PostgresWarehouse",
    "Warehouse",
    "WarehouseError",
    "connect",
    "describe_url",
]


def __getattr__(name: str) -> Any:
    # The connections load on first use: importing them loads polars, Arrow and the drivers,
    # which `changewatch info` (it only names the warehouse, through `urls`) does not need.
    if name in {"DuckDBWarehouse", "PostgresWarehouse", "Warehouse", "connect"}:
        from changewatch.warehouse import backends

        return getattr(backends, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
