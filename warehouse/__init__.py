"""The warehouse: where synced tables, change logs and sync bookkeeping live.

DuckDB (a local file, the default) or PostgreSQL (when the URL says so), behind one small
interface; SQL comes from ``sql/`` and is transpiled per backend.
"""

from __future__ import annotations

from changewatch.warehouse.backends import (
    DEFAULT_URL,
    DuckDBWarehouse,
    PostgresWarehouse,
    Warehouse,
    WarehouseError,
    connect,
    describe_url,
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
