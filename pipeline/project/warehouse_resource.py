"""Dagster resources: the warehouse connection every warehouse-writing asset shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from changewatch.evaluators.cascade import AnyJudge, make_judge
from changewatch.evaluators.config import Watch
from changewatch.pipeline.project.storage_paths import WAREHOUSE_URL_ENV
from changewatch.warehouse import DEFAULT_URL, Warehouse, connect, describe_url

__all__ = [
    "WAREHOUSE_POOL",
    "WAREHOUSE_URL_ENV",
    "JudgeResource",
    "WarehouseResource",
    "warehouse_pool",
    "warehouse_resource",
    "warehouse_url",
]

# The pool of every warehouse-writing asset on DuckDB, and the prefix of the pools on PostgreSQL.
WAREHOUSE_POOL = "warehouse"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg2://")


class WarehouseResource(dg.ConfigurableResource):
    """Opens the warehouse (DuckDB file or PostgreSQL) for the duration of one step."""

    url: str = DEFAULT_URL

    @contextmanager
    def connect(self) -> Iterator[Warehouse]:
        with connect(self.url) as wh:
            yield wh

    def describe(self) -> str:
        """The URL without any password, for metadata."""
        return describe_url(self.url)


def warehouse_url(environ: dict[str, str]) -> str:
    """The warehouse URL the code location uses (the variable, else the DuckDB default)."""
    return environ.get(WAREHOUSE_URL_ENV) or DEFAULT_URL


def warehouse_pool(url: str, *scope: str) -> str:
    """The Dagster pool of an asset that writes the warehouse at ``url``.

    A DuckDB file admits one writing process, so every writer shares the one ``warehouse``
    pool (one slot). PostgreSQL admits many: each asset gets a pool of its own, named by
    ``scope``, so different sources sync at once while two runs of one asset still wait for
    each other (``default_limit: 1``). The database keeps them correct either way (the sync,
    evaluation and DDL locks, UNIQUE dedupe keys, claimed deliveries); the pools only
    spare them from waiting on a lock or being dropped as a conflict.

    >>> warehouse_pool("duckdb:///w.duckdb", "source", "demo_issues")
    'warehouse'
    >>> warehouse_pool("postgresql://cw@db/cw", "source", "demo_issues")
    'warehouse/source/demo_issues'
    """
    if url.startswith(_POSTGRES_SCHEMES):
        return "/".join((WAREHOUSE_POOL, *scope))
    return WAREHOUSE_POOL


def warehouse_resource(environ: dict[str, str]) -> WarehouseResource:
    # EnvVar keeps the URL (which may hold a password) out of the run config Dagster stores
    # and shows; only the variable's name is recorded.
    if environ.get(WAREHOUSE_URL_ENV):
        return WarehouseResource(url=dg.EnvVar(WAREHOUSE_URL_ENV))
    return WarehouseResource(url=DEFAULT_URL)


class JudgeResource(dg.ConfigurableResource):
    """Builds the LLM judge of a watch: an openai client for the watch's endpoint and model.

    The endpoint, model and the *name* of the key's environment variable come from the watch;
    the key itself is read from the environment when the client is built, never stored.
    """

    def judge_for(self, watch: Watch) -> AnyJudge | None:
        if watch.judge is None:
            return None
        return make_judge(watch.judge)  # a Judge, or a Cascade of them (evaluators/cascade.py)
