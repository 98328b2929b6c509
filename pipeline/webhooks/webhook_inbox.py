"""The webhook inbox: verified deliveries, kept durably until a sync of their source covers them.

The receiver (pipeline/webhooks/webhook_receiver.py) puts each verified delivery here before it
answers 2xx; the webhook sensor (pipeline/triggers/webhook_sensor.py) reads what is pending and
requests syncs; a sync of the source, once committed, marks what it covered consumed
(pipeline/assets/sync_assets.py).

A SQLite file, not a warehouse table: a DuckDB warehouse admits one writing process and runs
hold it for minutes, while a provider wants an answer within seconds; the same file serves a
PostgreSQL warehouse, so one design fits both. WAL with ``synchronous=FULL``: a commit is on
disk before the receiver answers. Every process that uses it (the receiver, the code server,
the runs) must see the same file: ``$CHANGEWATCH_WEBHOOK_INBOX``, default
``.changewatch/webhooks.sqlite`` from the working directory, as the default warehouse is.

On several hosts there is no such file: where Dagster's storage is PostgreSQL
(``$DAGSTER_PG_URL``, as deploy/dagster.yaml has it) the inbox is a table in that database
(pipeline/webhooks/webhook_inbox_postgres.py), or in the one ``$CHANGEWATCH_WEBHOOK_INBOX`` names by
a ``postgresql://`` URL. ``open_inbox`` picks.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import adbc_driver_manager
from changewatch.sql import load

if TYPE_CHECKING:
    from changewatch.pipeline.webhooks.webhook_inbox_postgres import PostgresInbox

__all__ = [
    "DEFAULT_INBOX",
    "INBOX_ENV",
    "KEEP_CONSUMED_S",
    "Inbox",
    "INBOX_ERRORS",
    "Pending",
    "inbox_path",
    "open_inbox",
]

INBOX_ENV = "CHANGEWATCH_WEBHOOK_INBOX"
# What a store of either kind raises when it cannot be read or written (server down, disk
# full, locked past the wait): the caller answers 503 or leaves the deliveries pending.
INBOX_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, adbc_driver_manager.Error)
# Dagster's PostgreSQL storage (deploy/dagster.yaml): where it is set, the inbox lives there.
DAGSTER_PG_ENV = "DAGSTER_PG_URL"
DEFAULT_INBOX = ".changewatch/webhooks.sqlite"
# Consumed deliveries are kept this long, so a provider's late retry is still a duplicate.
KEEP_CONSUMED_S = 30 * 86400
# Deliveries one sensor tick reads at most; the rest come at the next tick.
PENDING_LIMIT = 10_000
# Processes share the file; a writer waits this long for another's short transaction.
_BUSY_S = 30.0


def inbox_path(environ: Mapping[str, str] | None = None) -> Path:
    """The inbox file: ``$CHANGEWATCH_WEBHOOK_INBOX``, else ``.changewatch/webhooks.sqlite``.

    >>> str(inbox_path({})), str(inbox_path({"CHANGEWATCH_WEBHOOK_INBOX": "/srv/in.sqlite"}))
    ('.changewatch/webhooks.sqlite', '/srv/in.sqlite')
    """
    environ = os.environ if environ is None else environ
    return Path(environ.get(INBOX_ENV) or DEFAULT_INBOX)


def _postgres_url(value: str) -> str | None:
    """``value`` as a libpq URL if it names a PostgreSQL database, else None.

    >>> _postgres_url("postgresql+psycopg2://cw@db/dagster"), _postgres_url("in.sqlite")
    ('postgresql://cw@db/dagster', None)
    """
    scheme, sep, rest = value.partition("://")
    if sep and scheme.split("+")[0] in ("postgresql", "postgres"):
        return f"postgresql://{rest}"
    return None


def open_inbox(environ: Mapping[str, str] | None = None) -> Inbox | PostgresInbox:
    """The inbox this process shares with the others: ``$CHANGEWATCH_WEBHOOK_INBOX`` (a file,
    or a ``postgresql://`` URL); unset, Dagster's database where ``$DAGSTER_PG_URL`` is set
    (several hosts), else the file ``.changewatch/webhooks.sqlite``."""
    from changewatch.pipeline.webhooks.webhook_inbox_postgres import PostgresInbox

    environ = os.environ if environ is None else environ
    chosen = environ.get(INBOX_ENV) or ""
    if not chosen:
        chosen = environ.get(DAGSTER_PG_ENV) or ""
        if not _postgres_url(chosen):
            chosen = ""
    url = _postgres_url(chosen)
    return PostgresInbox.shared(url) if url else Inbox(inbox_path(environ))


@dataclass(frozen=True)
class Pending:
    """A stored delivery no sync has covered yet."""

    seq: int
    source: str
    delivery_id: str


class Inbox:
    """The inbox file at ``path``; each call opens its own short connection, so threads and
    processes share it without holding it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def location(self) -> str:
        """Where the inbox is, for messages: the file's absolute path."""
        return str(self.path.resolve())

    def __repr__(self) -> str:
        return f"Inbox({str(self.path)!r})"

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(self.path, timeout=_BUSY_S)) as con:
            con.execute("PRAGMA journal_mode=WAL")  # readers never wait for the receiver
            con.execute("PRAGMA synchronous=FULL")  # each commit reaches the disk
            con.execute(load("create_webhook_inbox"))
            yield con

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
        with self._connect() as con, con:
            return con.execute(load("insert_webhook_inbox"), row).rowcount == 1

    def pending(self, *, after: int = 0, limit: int = PENDING_LIMIT) -> list[Pending]:
        """Deliveries after seq ``after`` that no sync has covered, oldest first."""
        if not self.path.exists():
            return []
        with self._connect() as con:
            rows = con.execute(load("select_webhook_inbox_pending"), (after, limit)).fetchall()
        return [Pending(*row) for row in rows]

    def last_seq(self) -> int:
        """The highest seq this file ever gave (0 for a new file), pruned deliveries included."""
        if not self.path.exists():
            return 0
        with self._connect() as con:
            return con.execute(load("select_webhook_inbox_last_seq")).fetchone()[0]

    def watermark(self, source: str) -> int:
        """The seq of ``source``'s last delivery so far (0 for none): a sync that begins
        fetching after this call covers every delivery up to it."""
        if not self.path.exists():
            return 0
        with self._connect() as con:
            return con.execute(load("select_webhook_inbox_watermark"), (source,)).fetchone()[0]

    def consume(self, source: str, upto: int, *, by: str, now: float | None = None) -> int:
        """Mark ``source``'s deliveries up to seq ``upto`` consumed by ``by`` (a run id, kept
        for the record only); drop those consumed over ``KEEP_CONSUMED_S`` ago. Returns how
        many this call marked."""
        if upto <= 0:
            return 0
        now = time.time() if now is None else now
        with self._connect() as con, con:
            marked = con.execute(
                load("update_webhook_inbox_consumed"), (now, by, source, upto)
            ).rowcount
            con.execute(load("delete_webhook_inbox_consumed"), (now - KEEP_CONSUMED_S,))
        return marked
