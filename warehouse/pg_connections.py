"""PostgreSQL connections that share one ADBC database handle per URI within a process.

Opening an ADBC PostgreSQL *database* handle reads the server's type catalogue (every row of
pg_type, with the columns of every table's row type) to build its type map; a *connection*
made from an open handle reuses that map. ``adbc_driver_postgresql.dbapi.connect`` opens a
handle for each connection, so each connection paid for the whole catalogue, which grows with
every table: 30 ms of CPU on an empty database, 470 ms (and a second of the server's) on a
warehouse of 1,000 sources, where a sync run opens two connections per source
(bench/bench_connect.py measures both ways).

The handle holds no session (the driver reads the catalogue on a connection of its own and
closes it), so keeping one for the process costs nothing on the server. Its map covers the
built-in types, which are all the warehouse's columns use: tables created later need no
new map.
"""

from __future__ import annotations

import threading

import adbc_driver_manager
import adbc_driver_manager.dbapi as dbapi
import adbc_driver_postgresql

__all__ = ["connect"]

_lock = threading.Lock()
# uri -> the handle its connections share. The cache holds a reference of its own, so the
# handle stays open for the process whatever its connections do.
_handles: dict[str, dbapi._SharedDatabase] = {}


def connect(uri: str) -> dbapi.Connection:
    """A DB-API connection to ``uri``, like ``adbc_driver_postgresql.dbapi.connect(uri)``
    (transactions not in autocommit), made from the process's handle for ``uri``."""
    handle = _handle(uri)
    connection = adbc_driver_manager.AdbcConnection(handle._db)
    try:
        return dbapi.Connection(handle, connection)
    except BaseException:
        connection.close()
        raise


def _handle(uri: str) -> dbapi._SharedDatabase:
    # Under the lock, so threads connecting at once read the catalogue once, not each.
    with _lock:
        handle = _handles.get(uri)
        if handle is None:  # a handle that failed to open raised here and is not kept
            handle = _handles[uri] = dbapi._SharedDatabase(adbc_driver_postgresql.connect(uri))
        return handle
