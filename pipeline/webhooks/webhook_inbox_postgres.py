"""The webhook inbox in PostgreSQL, for a deployment on several hosts.

The SQLite inbox (pipeline/webhooks/webhook_inbox.py) is a file the receiver, the code server and
every run must see on one disk. On several hosts they share Dagster's PostgreSQL instead: the
receiver stores each verified delivery in the table ``changewatch_webhook_inbox`` (committed before
it answers 2xx), the sensor reads it from the daemon's host, a run marks it consumed from
whichever worker ran it. The same methods as the file's, so neither side knows which it has.

Seqs come from an identity column. PostgreSQL hands them out when a row is inserted, not
when it commits, so two receivers could commit seq 8 after a sensor tick saw seq 9 and moved
its cursor past 8 for good. Writers therefore take one advisory transaction lock
(sql/lock_changewatch_webhook_inbox.sql): inserts commit in seq order, at a millisecond each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from changewatch.pipeline.webhooks.webhook_inbox import KEEP_CONSUMED_S, PENDING_LIMIT, Pending
from changewatch.sql import load
from changewatch.warehouse import pg_connections

__all__ = ["PostgresInbox", "redacted"]

_shared_lock = threading.Lock()
_shared: dict[str, PostgresInbox] = {}


def redacted(url: str) -> str:
    """``url`` without its password or query, to name it in logs and messages.

    >>> redacted("postgresql://cw:s3cret@db:5432/dagster?sslmode=require")
    'postgresql://cw@db:5432/dagster'
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=user + host, query=""))


class PostgresInbox:
    """The inbox table in the database at ``url`` (a libpq ``postgresql://`` URL).

    One connection per process and inbox, kept between calls under a lock (a delivery costs
    one commit, not a new session); a call that fails drops it, and the next opens another,
    so a restarted server costs the calls made while it was down and nothing after."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.location = redacted(url)
        self._lock = threading.Lock()
        self._connection = None

    def __repr__(self) -> str:
        return f"PostgresInbox({self.location!r})"

    @classmethod
    def shared(cls, url: str) -> PostgresInbox:
        """The process's inbox at ``url``: a sensor ticking every second reuses one
        connection rather than opening a session at each tick."""
        with _shared_lock:
            if url not in _shared:
                _shared[url] = cls(url)
            return _shared[url]

    @contextmanager
    def _cursor(self) -> Iterator:
        """A cursor in a transaction that commits on leaving, on the kept connection."""
        with self._lock:
            if self._connection is None:
                connection = pg_connections.connect(self.url)
                try:
                    with connection.cursor() as cur:
                        cur.execute(load("lock_changewatch_webhook_inbox"))
                        cur.execute(load("create_changewatch_webhook_inbox"))
                    connection.commit()
                except BaseException:
                    connection.close()
                    raise
                self._connection = connection
            try:
                with self._connection.cursor() as cur:
                    yield cur
                self._connection.commit()
            except BaseException:
                connection, self._connection = self._connection, None
                try:
                    connection.close()
                except Exception:  # the server went away: nothing left to close
                    pass
                raise

    def close(self) -> None:
        """Close the kept connection (the next call opens another)."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> PostgresInbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(
        self,
        source: str,
        delivery_id: str,
        *,
        provider: str,
        event: str | None,
        body: bytes,
        received_at: float | None = None,
    ) -> bool:
        """Store one verified delivery durably; False when it was stored before (a retry)."""
        received_at = time.time() if received_at is None else received_at
        row = (source, delivery_id, provider, event, received_at, body)
        with self._cursor() as cur:
            cur.execute(load("lock_changewatch_webhook_inbox"))
            cur.execute(load("insert_changewatch_webhook_inbox"), row)
            return cur.fetchone() is not None

    def pending(self, *, after: int = 0, limit: int = PENDING_LIMIT) -> list[Pending]:
        """Deliveries after seq ``after`` that no sync has covered, oldest first."""
        with self._cursor() as cur:
            cur.execute(load("select_changewatch_webhook_inbox_pending"), (after, limit))
            rows = cur.fetchall()
        return [Pending(*row) for row in rows]

    def last_seq(self) -> int:
        """The highest seq the table ever gave (0 for a new table), pruned ones included."""
        with self._cursor() as cur:
            cur.execute(load("select_changewatch_webhook_inbox_last_seq"))
            return int(cur.fetchone()[0])

    def watermark(self, source: str) -> int:
        """The seq of ``source``'s last delivery so far (0 for none): a sync that begins
        fetching after this call covers every delivery up to it."""
        with self._cursor() as cur:
            cur.execute(load("select_changewatch_webhook_inbox_watermark"), (source,))
            return int(cur.fetchone()[0])

    def consume(self, source: str, upto: int, *, by: str, now: float | None = None) -> int:
        """Mark ``source``'s deliveries up to seq ``upto`` consumed by ``by`` (a run id, kept
        for the record only); drop those consumed over ``KEEP_CONSUMED_S`` ago. Returns how
        many this call marked."""
        if upto <= 0:
            return 0
        now = time.time() if now is None else now
        with self._cursor() as cur:
            cur.execute(load("update_changewatch_webhook_inbox_consumed"), (now, by, source, upto))
            marked = int(cur.fetchone()[0])
            cur.execute(load("delete_changewatch_webhook_inbox_consumed"), (now - KEEP_CONSUMED_S,))
        return marked
