"""PostgreSQL connections that share one ADBC database handle per URI within a process.

Opening an ADBC PostgreSQL *database* handle reads the server's type catalogue (every row of
pg_type, with the columns of every table's row type) to build its type map; a *connection*
made from an open handle reuses that map. ``adbc_driver_postgresql.dbapi.connect`` opens a
handle for each connection, so each connection paid for the whole catalogue, which grows with
every table: 28 ms of CPU on an empty database, some 0.8 s on one of 4,000 tables, where a
sync run opens two connections per source (bench/bench_connect.py measures the ways).

The warehouse's own columns are all built-in types, so its connections use the driver's
built-in type map and read no catalogue at all (``type_resolver_mode=builtin``): a run, a
process of its own, no longer pays for the catalogue at its first connection either. With
``server_types`` a handle reads it as before, for what a person's query selects
(`changewatch sql`): there an enum of their own reads as its label, not as opaque bytes. That
map is the one read when the handle opened: a type created later reads as opaque bytes in
this process (a new process, as `changewatch sql` is, sees it).

The handle holds no session (the driver reads the catalogue on a connection of its own and
closes it), so keeping one for the process costs nothing on the server.

The driver counts a handle's open connections without a lock of its own, so connections of
one handle are opened and closed one at a time (under the handle's lock); the queries on them
run in parallel.
"""

from __future__ import annotations

import threading

import adbc_driver_manager
import adbc_driver_manager.dbapi as dbapi
import adbc_driver_postgresql

__all__ = ["connect"]


class _Handle:
    """A URI's database handle, opened by its first connection, and the lock around it."""

    def __init__(self) -> None:
        # Re-entrant: a connection collected (closed) by the garbage collector on a thread
        # that holds the lock must not wait for itself.
        self.lock = threading.RLock()
        self.shared: dbapi._SharedDatabase | None = None


class _Connection(dbapi.Connection):
    """A DB-API connection whose close is serialized with its handle's other opens/closes."""

    def __init__(self, handle: _Handle, connection: adbc_driver_manager.AdbcConnection) -> None:
        self._handle = handle
        super().__init__(handle.shared, connection)

    def close(self) -> None:
        with self._handle.lock:
            super().close()


_lock = threading.Lock()  # guards _handles only; opening a handle holds its own lock
# (uri, server_types) -> its handle. The cache holds a reference of its own to the shared
# database, so it stays open for the process whatever its connections do.
_handles: dict[tuple[str, bool], _Handle] = {}
# The driver's option that builds its type map from the built-in types it knows, no query.
_BUILTIN_TYPES = {"adbc.postgresql.type_resolver_mode": "builtin"}


def connect(uri: str, *, server_types: bool = False) -> dbapi.Connection:
    """A DB-API connection to ``uri``, like ``adbc_driver_postgresql.dbapi.connect(uri)``
    (transactions not in autocommit), made from the process's handle for ``uri``: one that
    knows the built-in types, or with ``server_types`` one that read the server's catalogue."""
    with _lock:
        handle = _handles.setdefault((uri, server_types), _Handle())
    with handle.lock:
        if handle.shared is None:  # a handle that fails to open raises here, and is retried
            options = None if server_types else _BUILTIN_TYPES
            handle.shared = dbapi._SharedDatabase(
                adbc_driver_postgresql.connect(uri, db_kwargs=options)
            )
        connection = adbc_driver_manager.AdbcConnection(handle.shared._db)
    try:
        return _Connection(handle, connection)
    except BaseException:
        with handle.lock:
            connection.close()
        raise
