"""Dagster's PostgreSQL storage, holding its connections open.

dagster-postgres opens a new connection for every query of its storage (SQLAlchemy's
NullPool) outside the webserver, each a PostgreSQL backend started and torn down: a run opens
one for every event it writes, and the daemon more at every queue pass and sensor tick.
This storage is Dagster's own with the pooling the webserver uses
(``optimize_for_webserver``: one connection kept per storage, more opened while needed) for
runs and event logs, which take nearly all the queries, so the daemon, the code server and
every run reuse theirs. deploy/dagster.yaml selects it::

    storage:
      custom:
        module: changewatch.pipeline.definitions.postgres_storage
        class: PooledPostgresStorage
        config:
          postgres_url: {env: DAGSTER_PG_URL}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dagster._core.storage.base_storage import DagsterStorage
from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.event_log import PostgresEventLogStorage
from dagster_postgres.run_storage import PostgresRunStorage
from dagster_postgres.schedule_storage import PostgresScheduleStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config

if TYPE_CHECKING:
    from dagster_postgres.auth import PgTokenProvider

__all__ = ["PooledPostgresStorage"]

# Seconds a kept connection lives before it is replaced (the webserver's default).
POOL_RECYCLE_S = 3600
# Connections a process may open beyond the kept one while threads use the storage at once
# (the daemon's threads, a run's sync threads); closed when returned.
MAX_OVERFLOW = 20


class _Pooled:
    """Mixed into a dagster-postgres storage: the webserver's pooling, closed on dispose."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # statement_timeout 0: none, as without the pool.
        self.optimize_for_webserver(0, POOL_RECYCLE_S, MAX_OVERFLOW)

    def dispose(self) -> None:
        # The instance disposes its run and event storages when it closes (the code server
        # makes one per sensor tick): its kept connection goes with it.
        super().dispose()
        self._engine.dispose()


class _PooledRunStorage(_Pooled, PostgresRunStorage):
    pass


class _PooledEventLogStorage(_Pooled, PostgresEventLogStorage):
    pass


class PooledPostgresStorage(DagsterPostgresStorage):
    """``DagsterPostgresStorage`` (same config, same tables) whose run and event log storages
    keep their connections; the schedule storage, which the instance never disposes and
    which is queried a few times a tick, opens one per query as before."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider: PgTokenProvider | None = None,
    ) -> None:
        # DagsterPostgresStorage.__init__ with the pooled storages in place of two of its own
        # (calling it would open and check the database for storages thrown away).
        self.postgres_url = postgres_url
        self.should_autocreate_tables = should_autocreate_tables
        self._inst_data = inst_data
        args = (postgres_url, should_autocreate_tables)
        self._run_storage = _PooledRunStorage(*args, token_provider=token_provider)
        self._event_log_storage = _PooledEventLogStorage(*args, token_provider=token_provider)
        self._schedule_storage = PostgresScheduleStorage(*args, token_provider=token_provider)
        DagsterStorage.__init__(self)

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
