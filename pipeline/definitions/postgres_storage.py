"""Dagster's PostgreSQL storage, holding its connections open.

dagster-postgres opens a new connection for every query of its storage (SQLAlchemy's
NullPool) outside the webserver, each a PostgreSQL backend started and torn down: a run opens
one for every event it writes, and the daemon more at every queue pass and sensor tick.
This storage is Dagster's own with the pooling the webserver uses
(``optimize_for_webserver``: one connection kept per storage, more opened while needed) for
runs and event logs, which take nearly all the queries, so the daemon, the code server and
every run reuse theirs. A kept connection is pinged before use and a new one waits about 50 s
for the database, so a restart of the db host costs no event written meanwhile
(dagster-postgres gives up after about 11 s). deploy/dagster.yaml selects it::

    storage:
      custom:
        module: changewatch.pipeline.definitions.postgres_storage
        class: PooledPostgresStorage
        config:
          postgres_url: {env: DAGSTER_PG_URL}
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from dagster._core.storage.base_storage import DagsterStorage
from dagster._serdes import ConfigurableClassData
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.event_log import PostgresEventLogStorage
from dagster_postgres.run_storage import PostgresRunStorage
from dagster_postgres.schedule_storage import PostgresScheduleStorage
from dagster_postgres.utils import (
    create_pg_engine,
    get_token_provider_from_config,
    pg_url_from_config,
    retry_pg_connection_fn,
)
from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from dagster_postgres.auth import PgTokenProvider

__all__ = ["PooledPostgresStorage"]

# Seconds a kept connection lives before it is replaced (the webserver's default).
POOL_RECYCLE_S = 3600
# Connections a process may open beyond the kept one while threads use the storage at once
# (the daemon's threads, a run's sync threads); closed when returned.
MAX_OVERFLOW = 20
# Tries a query makes to reach the database before it fails: a restart of the db host (seconds
# to tens of seconds) must not lose a step's failure or a run's end, written while it is down.
# dagster-postgres waits (2^n - 1) x 0.2 s before its n-th retry: its default 5 give up after
# about 11 s, these 7 after about 49.
PATIENT_RETRIES = 7


class _Pooled:
    """Mixed into a dagster-postgres storage: the webserver's pooling, closed on dispose, and
    connections that outlive a restart of the database."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The webserver's pool (optimize_for_webserver), with each kept connection pinged
        # when taken: after a restart of the database it is dead, and without the ping the
        # first query of each process would fail on it (tests/hosts, the db host restarted).
        options = self._engine.url.query.get("options")
        self._engine = create_pg_engine(
            self.postgres_url,
            self._token_provider,
            isolation_level="AUTOCOMMIT",
            pool_size=1,
            pool_recycle=POOL_RECYCLE_S,
            max_overflow=MAX_OVERFLOW,
            pool_pre_ping=True,
            **({"connect_args": {"options": options}} if options else {}),
        )

    @contextmanager
    def _patient_connection(self) -> Iterator[Connection]:
        """A connection of the pool, waiting about 50 s for the database (dagster-postgres's own
        retry, with more tries than its default)."""
        with retry_pg_connection_fn(self._engine.connect, retry_limit=PATIENT_RETRIES) as conn:
            yield conn

    def dispose(self) -> None:
        # The instance disposes its run and event storages when it closes (the code server
        # makes one per sensor tick): its kept connection goes with it.
        super().dispose()
        self._engine.dispose()


class _PooledRunStorage(_Pooled, PostgresRunStorage):
    def connect(self) -> AbstractContextManager[Connection]:
        return self._patient_connection()


class _PooledEventLogStorage(_Pooled, PostgresEventLogStorage):
    def _connect(self) -> AbstractContextManager[Connection]:
        return self._patient_connection()


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
