"""Dagster resources: the warehouse connection every warehouse-writing asset shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from changewatch.evaluators.config import Watch
from changewatch.evaluators.judge import Judge, build_client
from changewatch.warehouse import DEFAULT_URL, Warehouse, connect, describe_url

__all__ = ["WAREHOUSE_URL_ENV", "JudgeResource", "WarehouseResource", "warehouse_resource"]

WAREHOUSE_URL_ENV = "CHANGEWATCH_WAREHOUSE_URL"


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

    def judge_for(self, watch: Watch) -> Judge | None:
        if watch.judge is None:
            return None
        return Judge(watch.judge, client=build_client(watch.judge))
