"""Dagster's PostgreSQL storage, holding its connections open.

dagster-postgres opens a new connection for every query of its storage (SQLAlchemy's
NullPool) outside the webserver: a run of 24 syncs opened some 1,700, each a PostgreSQL
backend started and torn down, and the daemon opens more at every queue pass and sensor tick.
This storage is Dagster's own with the pooling the webserver uses
(``optimize_for_webserver``: one connection kept per storage, more opened while needed), so
the daemon, the code server and every run reuse theirs. deploy/dagster.yaml selects it::

    storage:
      custom:
        module: changewatch.pipeline.pg_storage
        class: PooledPostgresStorage
        config:
          postgres_url: {env: DAGSTER_PG_URL}
"""

from __future__ import annotations

from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

__all__ = ["PooledPostgresStorage"]

# Seconds a kept connection lives before it is replaced (the webserver's default).
POOL_RECYCLE_S = 3600
# Connections a process may open beyond the kept one while threads use the storage at once
# (the daemon's threads, a run's sync threads); closed when returned.
MAX_OVERFLOW = 20


class PooledPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` (same config, same tables) with pooled connections."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for storage in (self._run_storage, self._event_log_storage, self._schedule_storage):
            # statement_timeout 0: none, as without the pool.
            storage.optimize_for_webserver(
                statement_timeout=0, pool_recycle=POOL_RECYCLE_S, max_overflow=MAX_OVERFLOW
            )

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value
    ) -> PooledPostgresStorage:
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )
