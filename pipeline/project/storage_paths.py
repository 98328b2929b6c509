"""Where the commands read and write: the Dagster instance's folder and the warehouse.

Standard library only, so `changewatch info` answers at once: it names the places without
loading Dagster or opening anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from changewatch.warehouse.urls import DEFAULT_URL, describe_url, duckdb_path, is_postgres_url

__all__ = [
    "CONFIG_ENV",
    "DAGSTER_HOME_ENV",
    "DEFAULT_CONFIG",
    "EPHEMERAL",
    "WAREHOUSE_URL_ENV",
    "config_path",
    "dagster_home",
    "locations_line",
    "warehouse_location",
]

CONFIG_ENV = "CHANGEWATCH_CONFIG"
DEFAULT_CONFIG = "watches.yaml"
DAGSTER_HOME_ENV = "DAGSTER_HOME"
WAREHOUSE_URL_ENV = "CHANGEWATCH_WAREHOUSE_URL"
EPHEMERAL = "ephemeral (runs are not kept; set DAGSTER_HOME to keep them)"


def config_path(path: str | Path | None = None) -> Path:
    """The watches file to use: ``path``, else ``$CHANGEWATCH_CONFIG``, else ``watches.yaml``."""
    return Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def dagster_home() -> str | None:
    """The folder of the Dagster instance the commands record runs in: ``$DAGSTER_HOME``, or
    this folder if it holds the project's dagster.yaml (so ``dagster dev`` shows the runs);
    ``None`` when there is neither (the runs go to an ephemeral instance)."""
    home = os.environ.get(DAGSTER_HOME_ENV)
    if home:
        return home
    return str(Path.cwd()) if Path("dagster.yaml").is_file() else None


def warehouse_location() -> str:
    """Where the commands read and write: the DuckDB file's absolute path, or the URL
    without its password."""
    url = os.environ.get(WAREHOUSE_URL_ENV) or DEFAULT_URL
    if is_postgres_url(url):
        return describe_url(url)
    return str(duckdb_path(url).resolve())


def locations_line(home: str | None) -> str:
    """One line naming the Dagster instance's folder and the warehouse a command uses, so a
    run started outside the repository says where to look for it."""
    return f"dagster instance: {home or EPHEMERAL}  warehouse: {warehouse_location()}"
