"""Warehouse connections handed from one job to the next within a process (a batched run's step).

A batched run's one step syncs, evaluates and delivers for many sources, each job opening the
warehouse for itself, as its own asset step did. On PostgreSQL each open is a new session (a
server process started, authenticated, its catalogue caches warmed by its first statements),
several milliseconds of CPU on both sides per changed source; the same work with one
connection (bench/bench_batch_cost.py's "work alone") does not pay them. A ``ConnectionPool``
keeps the connections a job is done with for the next one.

A connection is only reused when its job ended without an exception and ``Warehouse.reset``
makes it as good as new (no transaction left open, nothing staged, no session lock held);
otherwise it is closed, as before, and the next job opens a fresh one. DuckDB connections are
never reused (``reset`` says no): a DuckDB batch runs its jobs one after another anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from changewatch.warehouse.backends import Warehouse, connect

__all__ = ["ConnectionPool"]


class ConnectionPool:
    """Connections to ``url`` for jobs on up to ``size`` threads at once; ``close`` them at
    the end (or use the pool as a context manager)."""

    def __init__(self, url: str, *, size: int = 4) -> None:
        self.url = url  # may hold a password, never shown
        self.size = size
        self._idle: list[Warehouse] = []
        self._lock = threading.Lock()
        self._closed = False
        self.opened = 0  # connections opened so far (tests and benches read it)

    @contextmanager
    def connect(self) -> Iterator[Warehouse]:
        """A connection for a ``with`` block: an idle one of the pool, or a new one."""
        with self._lock:
            wh = self._idle.pop() if self._idle else None
        if wh is None:
            wh = connect(self.url)
            self.opened += 1
        try:
            yield wh
        except BaseException:
            # Whatever state it is in (a transaction, a lock, a broken socket), it goes.
            with suppress(Exception):
                wh.close()
            raise
        self._give_back(wh)

    def _give_back(self, wh: Warehouse) -> None:
        if wh.reset():
            with self._lock:
                if not self._closed and len(self._idle) < self.size:
                    self._idle.append(wh)
                    return
        with suppress(Exception):
            wh.close()

    def close(self) -> None:
        """Close the idle connections; connections in use are closed when given back."""
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for wh in idle:
            with suppress(Exception):
                wh.close()

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
