"""The normalized rows of one fetch, kept in a private DuckDB that spills to disk.

A sync of a million records must not hold a million records in memory: normalized batches are
appended here as they come, DuckDB keeps at most ``memory_limit`` of them in memory (the rest
goes to a temporary directory), and the sync reads them back with SQL or as Arrow record
batches of bounded size.

When the stored keys and hashes are loaded first (``load_stored``, a snapshot sync), a row
that matches its stored content and payload goes to table ``seen`` as its key, updated-at and
arrival only: an unchanged re-sync stages a few dozen bytes a row, whatever the payloads weigh.
They may load while the walk starts (``load_stored_aside``): batches staged before they are in
are staged whole.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
from changewatch import sql
from changewatch.sources.base import SourceBase
from changewatch.sources.normalize import (
    HASH_COLUMN,
    POLARS_TYPES,
    RAW_COLUMN,
    RAW_HASH_COLUMN,
    SYNCED_AT_COLUMN,
    UTC_MICROS,
)

__all__ = ["MEMORY_LIMIT", "STAGE_TYPES", "STREAM_ROWS", "StagedFetch"]

# What DuckDB may keep in memory for one sync (normalizing, deduplicating, diffing); the rest
# spills to disk. The sort that numbers a million-row change log needed more than 128 MB; 160
# MB held for it (192 MB before re-syncs staged unchanged rows as keys only), and keeps a
# million-row sync under 600 MiB in all.
MEMORY_LIMIT = "160MB"
# What it may keep while two streams are read out of it at once (``two_streams``). The stage
# is never checkpointed (see _create), so its rows stay as appended, uncompressed; a million-row
# PostgreSQL first sync, which reads its table and its change log at once, ran out of 160 MB
# there and fit in 192 (peak RSS 540 MiB; one stream at a time stays at 160 MB, so a DuckDB
# warehouse's 128 MB cache fits beside it under 600 MiB).
TWO_STREAMS_MEMORY_LIMIT = "192MB"
# Rows per Arrow record batch read out of the stage: a warehouse row group.
STREAM_ROWS = 16_384
# What DuckDB needs, in memory, per byte of the largest JSON document it normalizes: parsing
# allocates yyjson arenas that grow by doubling and cannot spill, and a json column's value is
# written out again (json_transform, the hash's to_json). Measured by `bench/bench_big_values.py
# --least-limit` (DuckDB 2.0, the least limit that passed): a text value 19-20x the document
# (479 MiB at 24.5 MiB, 951 MiB at 50), a json column's 35x (255 MiB at 10, 863 MiB at 24.5);
# 24x failed a 24.5 MiB json value (issue 30). The limit is a cap, not an allocation: the RSS
# of a sync of a 32 MiB value stayed under 0.75 GiB. The stage grows to this for a large
# document (``make_room``), so ordinary pages (a few MiB at most) stay within MEMORY_LIMIT.
PARSE_BYTES_PER_BYTE = 40

# Declared types as DuckDB stores them here. JSON stays text, as it leaves normalization.
STAGE_TYPES = {
    "text": "VARCHAR",
    "bigint": "BIGINT",
    "integer": "INTEGER",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "timestamp": "TIMESTAMPTZ",
    "json": "VARCHAR",
    "text[]": "VARCHAR[]",
    "bigint[]": "BIGINT[]",
}


# Idle stage databases this process keeps for its next syncs, at most this many. Opening an
# in-memory DuckDB costs some 16 ms of CPU and closing it 4 more: more than the rest of a small
# sync's work in its stage (bench/profile_alone.py: 0.020 of 0.088 core-s a changed source).
# A stage is emptied when its sync ends (every table dropped, its memory limit put back), so
# an idle one holds no rows; a batched run's syncs on threads each take one of their own.
IDLE_STAGES = 4


class _StageDatabase:
    """One private DuckDB and its spill folder, reused by one sync after another."""

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="changewatch-fetch-")
        try:
            self.connection = duckdb.connect(
                config={
                    # One thread while the walk goes on (normalization shares the machine).
                    "threads": 1,
                    "memory_limit": MEMORY_LIMIT,
                    "temp_directory": self.tmp.name,
                    # Rows carry their arrival; nothing here depends on the order they are
                    # stored or read in, and keeping it costs memory in every streamed query.
                    "preserve_insertion_order": False,
                    # Never checkpoint. Even in memory, DuckDB checkpoints after 16 MiB of
                    # changes, compressing the row groups (zstd, FSST) on the thread that
                    # appends: 2-3 s each time, at 0.43, 0.68 and 0.94 million rows of a first
                    # sync, while the walk waits (normalizing a million rows took 22.6 s, 15.9 s
                    # without). The stage lives for one sync; uncompressed, it spills.
                    "checkpoint_threshold": "1TB",
                }
            )
            # Timestamps leave DuckDB in UTC whatever the machine's zone; the hash depends on it.
            self.connection.execute("SET TimeZone = 'UTC'")
        except BaseException:
            self.tmp.cleanup()
            raise

    def empty(self) -> bool:
        """Drop everything a sync made here and put the memory limit back; False when that
        failed (the database is then closed, not reused)."""
        try:
            con = self.connection
            made = con.execute(
                "SELECT 'VIEW', database_name, schema_name, view_name FROM duckdb_views() "
                "WHERE NOT internal UNION ALL "
                "SELECT 'TABLE', database_name, schema_name, table_name FROM duckdb_tables() "
                "WHERE NOT internal"
            ).fetchall()
            # One call (a statement each costs a call's overhead), views first: they read tables.
            con.execute(
                "".join(f"DROP {k} IF EXISTS {_q(c)}.{_q(s)}.{_q(n)}; " for k, c, s, n in made)
                + f"SET memory_limit = '{MEMORY_LIMIT}'"
            )
            return True
        except Exception:  # noqa: BLE001 - a stage in doubt is closed; a new one is cheap
            return False

    def close(self) -> None:
        try:
            self.connection.close()
        finally:
            self.tmp.cleanup()


_idle: list[_StageDatabase] = []
_idle_lock = threading.Lock()


def _take_database() -> _StageDatabase:
    with _idle_lock:
        if _idle:
            return _idle.pop()
    return _StageDatabase()


def _give_back(database: _StageDatabase) -> None:
    if database.empty():
        with _idle_lock:
            if len(_idle) < IDLE_STAGES:
                _idle.append(database)
                return
    database.close()


# A forked child must not use its parent's DuckDB connections: it starts with none idle.
os.register_at_fork(after_in_child=_idle.clear)


class StagedFetch:
    """Table ``fetched`` (declared columns, ``_content_hash``, ``_raw``, ``_raw_hash``,
    ``_arrival``) of a private DuckDB, table ``seen`` (the rows that match their stored version:
    key, updated-at, ``_arrival``), view ``walked`` over both (every key the walk met), plus
    whatever tables a sync loads next to it (``load``), such as ``stored``: the stored keys
    and hashes.

    Close it (or use it as a context manager) to drop its tables and spilled rows; the empty
    database is kept for this process's next stage (``IDLE_STAGES``).
    """

    def __init__(self, config: SourceBase, *, memory_limit: str = MEMORY_LIMIT) -> None:
        self.config = config
        # The memory limit now, in bytes; only ever raised (make_room, two_streams).
        self._memory_limit = _bytes(memory_limit)
        self._room = threading.Lock()
        self._storing: Future[None] | None = None
        self._database: _StageDatabase | None = _take_database()
        self.connection = self._database.connection
        try:
            if memory_limit != MEMORY_LIMIT:
                self.connection.execute(f"SET memory_limit = '{memory_limit}'")
            self._create()
        except BaseException:
            self.close()  # a half-made stage leaves no tables behind
            raise
        self.synced_at: datetime | None = None
        # Records merged into another of the same key by keep_newest.
        self.duplicates = 0
        # Rows walked, once counted; forgotten when rows are added.
        self._height: int | None = None
        # Whether ``stored`` is loaded, and whether it has rows to look batches up in.
        self.has_stored = False
        self._lookup: list[str] = []

    def _create(self) -> None:
        config = self.config
        columns = ", ".join(
            f"{_q(name)} {STAGE_TYPES[spec.type]}" for name, spec in config.columns.items()
        )
        kept = [*config.primary_key, *([config.updated_at] if config.updated_at else [])]
        self._kept = ", ".join(_q(c) for c in kept)
        seen = ", ".join(f"{_q(c)} {STAGE_TYPES[config.columns[c].type]}" for c in kept)
        # One call (each costs a call's overhead, and a small sync makes a dozen).
        self.connection.execute(
            f"CREATE TABLE fetched ({columns}, {HASH_COLUMN} VARCHAR, {RAW_COLUMN} VARCHAR, "
            f"{RAW_HASH_COLUMN} BIGINT, _arrival BIGINT); "
            f"CREATE TABLE seen ({seen}, _arrival BIGINT); "
            f"CREATE VIEW walked AS SELECT {self._kept}, _arrival FROM fetched "
            f"UNION ALL SELECT {self._kept}, _arrival FROM seen"
        )

    def __enter__(self) -> StagedFetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the stage's tables (its database and spill folder are kept for the next sync of
        this process, or closed and removed); closing twice does nothing."""
        if self._storing is not None:
            # The load reads the warehouse's connection: the caller may use it once this returns.
            with suppress(BaseException):
                self._storing.result()
        database, self._database = self._database, None
        if database is not None:
            _give_back(database)

    def insert(self, rows: str, connection: duckdb.DuckDBPyConnection) -> None:
        """Add the rows of one normalized batch through ``connection``, this stage's connection
        or a cursor of it. ``rows`` is a query of them (``normalize_into`` hands it over): they
        go from DuckDB to DuckDB, never through Python."""
        # Until the stored keys are in (load_stored_aside), rows are staged whole: one that
        # matches its stored version then costs its payload's room, and the diff, by hash,
        # finds it unchanged all the same. The list is replaced whole, never changed in place.
        self._height = None
        lookup = self._lookup
        if not lookup:
            connection.execute(sql.load("insert_fetched_records").format(rows=rows))
            return
        # Read three times (the lookup, then the two inserts): computed once.
        connection.execute(sql.load("create_batch_records").format(rows=rows))
        try:
            for statement in lookup:
                connection.execute(statement)
        finally:
            connection.execute("DROP TABLE IF EXISTS cw_batch")

    def load_stored(self, data: pa.RecordBatchReader | pa.Table) -> None:
        """Load the stored keys, content and raw hashes (``sql/select_hashes_entity.sql``) as
        table ``stored``, before any batch: from now on, the rows of a batch that match their
        stored version go to ``seen``, the others to ``fetched``.
        """
        # On a cursor of its own: it may run beside the batches' normalizing (load_stored_aside).
        with self.connection.cursor() as cursor:
            _create_from(cursor, "stored", data)
            any_stored = cursor.execute("SELECT EXISTS (FROM stored)").fetchall()[0][0]
        self.has_stored = True
        if not any_stored:
            return  # a first sync: every row is new, nothing to look up
        key_join = " AND ".join(f"s.{_q(k)} = b.{_q(k)}" for k in self.config.primary_key)
        self._lookup = [
            sql.load("create_matched_batch").format(key_join=key_join),
            sql.load("insert_seen_batch").format(kept=self._kept),
            sql.load("insert_fetched_batch"),
        ]

    def load_stored_aside(self, load: Callable[[], None]) -> None:
        """Run ``load`` (which calls ``load_stored``) on a thread of its own and return at once.

        A snapshot sync starts its walk meanwhile instead of waiting for every stored key and
        hash first (a tenth of a second at 100,000 rows, about one at a million). Batches
        ``insert``ed meanwhile do not wait: they are staged whole. ``wait_stored`` waits for
        the load (the diff needs it); ``close`` does too, since it reads the warehouse.
        """
        storing: Future[None] = Future()
        self._storing = storing

        def run() -> None:
            try:
                load()
            except BaseException as error:  # noqa: BLE001 - raised where the stage waits
                storing.set_exception(error)
            else:
                storing.set_result(None)

        threading.Thread(target=run, name="changewatch-stored", daemon=True).start()

    def wait_stored(self) -> None:
        """Return once a load started by ``load_stored_aside`` is done; raise its error."""
        if self._storing is not None:
            self._storing.result()

    def keep_newest(self) -> int:
        """One row per key: an object seen twice in the walk keeps its newest version, the one
        with the latest updated-at (none counts as oldest), else the last in walk order.
        Returns (and keeps in ``duplicates``) how many records were merged away."""
        keys = ", ".join(_q(k) for k in self.config.primary_key)
        walked, distinct = self.fetch(f"SELECT count(*), count(DISTINCT ({keys})) FROM walked")[0]
        duplicates = walked - distinct
        self.duplicates = duplicates
        # What ``height`` would count now: one row per key. (A query on the stage costs about
        # a millisecond, whatever its size: a small sync makes a dozen.)
        self._height = distinct
        if not duplicates:
            return 0
        newest = f"{_q(self.config.updated_at)} DESC NULLS LAST, " if self.config.updated_at else ""
        for table in ("fetched", "seen"):  # the copies of one object may be in either
            self.execute(
                sql.load("delete_fetched_stale").format(
                    table=table, keys=keys, order=f"{newest}_arrival DESC"
                )
            )
        return duplicates

    def two_streams(self) -> None:
        """Make room for two results streamed out at once (see ``TWO_STREAMS_MEMORY_LIMIT``)."""
        self._raise_limit(_bytes(TWO_STREAMS_MEMORY_LIMIT), self.connection)

    def make_room(self, document_bytes: int, connection: duckdb.DuckDBPyConnection) -> None:
        """Let DuckDB hold what normalizing a document of ``document_bytes`` takes (see
        ``PARSE_BYTES_PER_BYTE``), through ``connection`` (this stage's, or a cursor of it):
        the limit is the database's, and stays raised for the rest of the sync, whose diff
        and change log carry the same large value."""
        self._raise_limit(PARSE_BYTES_PER_BYTE * document_bytes, connection)

    def _raise_limit(self, limit: int, connection: duckdb.DuckDBPyConnection) -> None:
        with self._room:
            if limit <= self._memory_limit:
                return
            connection.execute(f"SET memory_limit = '{limit // 1024}KiB'")
            self._memory_limit = limit

    @property
    def height(self) -> int:
        """Rows walked (fetched and seen)."""
        if self._height is None:
            self._height = self.fetch("SELECT count(*) FROM walked")[0][0]
        return self._height

    def execute(self, statement: str, params: Sequence[Any] = ()) -> None:
        self.connection.execute(statement, list(params))

    def fetch(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.connection.execute(statement, list(params)).fetchall()

    def arrow(self, statement: str, params: Sequence[Any] = ()) -> pa.Table:
        """A small result (keys, counts) as one Arrow table."""
        return self.connection.sql(statement, params=list(params)).to_arrow_table()

    @contextmanager
    def reader(
        self, statement: str, params: Sequence[Any] = (), *, rows: int = STREAM_ROWS
    ) -> Iterator[pa.RecordBatchReader]:
        """A result streamed in record batches of ``rows`` rows, on its own cursor (so the
        stage can run other statements while it is read, from another thread too)."""
        with self.connection.cursor() as cursor:
            yield cursor.sql(statement, params=list(params)).to_arrow_reader(rows)

    def load(self, name: str, data: pa.RecordBatchReader | pa.Table) -> None:
        """Store ``data`` (read once, batch by batch) as table ``name``."""
        _create_from(self.connection, name, data)

    def frame(self) -> pl.DataFrame:
        """Every row as one frame in arrival order, in ``normalize``'s layout (for tests and
        small fetches: it holds the whole fetch)."""
        table = self.arrow("FROM fetched UNION ALL BY NAME FROM seen ORDER BY _arrival")
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        return frame.select(
            *(pl.col(n).cast(POLARS_TYPES[s.type]) for n, s in self.config.columns.items()),
            HASH_COLUMN,
            pl.lit(self.synced_at).cast(UTC_MICROS).alias(SYNCED_AT_COLUMN),
            RAW_COLUMN,
        )


def _create_from(
    connection: duckdb.DuckDBPyConnection, name: str, data: pa.RecordBatchReader | pa.Table
) -> None:
    """Store ``data`` (read once, batch by batch) as table ``name`` through ``connection``."""
    connection.register("cw_incoming", data)
    try:
        connection.execute(f"CREATE OR REPLACE TABLE {_q(name)} AS FROM cw_incoming")
    finally:
        connection.unregister("cw_incoming")


def _bytes(limit: str) -> int:
    """Bytes of a DuckDB memory limit written in MB.

    >>> _bytes("160MB")
    160000000
    """
    assert limit.endswith("MB"), limit
    return int(limit[:-2]) * 1000 * 1000


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
