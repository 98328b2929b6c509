"""DuckDB and PostgreSQL connections behind one interface: statements, Arrow in and out."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import polars as pl
import pyarrow as pa
from changewatch.warehouse.statements import literal, quote, render
from changewatch.warehouse.urls import DEFAULT_URL, WarehouseError, describe_url, duckdb_path

__all__ = [
    "DEFAULT_URL",
    "ConnectionLost",
    "DuckDBWarehouse",
    "PostgresWarehouse",
    "Rows",
    "Warehouse",
    "WarehouseError",
    "connect",
    "describe_url",
]

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Rows per DuckDB row group (DuckDB's default is 122,880): small enough that a sync of some
# tens of thousands of rows is written while it is inserted, large enough to compress well.
ROW_GROUP_ROWS = 16_384
# What a DuckDB warehouse's buffer pool may hold in memory.
MEMORY_LIMIT = "128MB"
_MEMORY_LIMIT_BYTES = 128 * 1000 * 1000
# What a DuckDB warehouse needs in memory per byte of the largest value it writes (make_room).
# Measured by `bench/bench_big_values.py --least-limit` (DuckDB 2.0, the least limit that let
# the rows in): a text value and its raw payload 6-8x the document (191 MiB at 24.5 MiB: one
# 128 MiB allocation), with a json column 11-14x (351 MiB at 24.5). 6x failed a 24.5 MiB value.
_VALUE_ROOM = 16
# Catalog names DuckDB keeps for itself; a warehouse file named so is attached as "warehouse".
_RESERVED_CATALOGS = {"memory", "system", "temp", "main"}
# How long a first sync's second connection waits for a lock on the source table. It only ever
# needs a shared one, which the sync's own connection holds too; a wait means someone queued
# for an exclusive lock behind the sync, which would otherwise wait for the sync forever.
_LOAD_LOCK_TIMEOUT = "10s"


class ConnectionLost(WarehouseError):
    """The connection to the warehouse went away (the server ended it, the network dropped)
    in the middle of a transaction, which the server has rolled back."""


# What can be staged or bulk loaded: a frame, an Arrow table, or Arrow record batches streamed
# from elsewhere (read once).
Rows = pl.DataFrame | pa.Table | pa.RecordBatchReader


class Warehouse(ABC):
    """One connection, used by one thread; every write goes through ``transaction()``."""

    dialect: str
    # Whether bulk_load_aside may load a table on the side (else it never does).
    loads_aside: bool = False
    # Storage clause for a source table's raw payload column, after its type (backend DDL
    # that portable SQL cannot say).
    raw_storage: str = ""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement."""

    @abstractmethod
    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query and return its rows as tuples."""

    @abstractmethod
    def fetch_frame(self, sql: str, params: Sequence[Any] = ()) -> pl.DataFrame:
        """Run a query and return its result as a polars frame (via Arrow, no row loop)."""

    @abstractmethod
    def fetch_batches(self, sql: str, params: Sequence[Any] = ()) -> pa.RecordBatchReader:
        """Run a query and stream its result as Arrow record batches (read it before the next
        statement on this connection)."""

    @abstractmethod
    def stage(self, name: str, frame: Rows) -> None:
        """Make ``frame`` queryable as table ``name`` on this connection, until ``unstage``.

        A record batch reader is read once: stage it for one statement.
        """

    @abstractmethod
    def unstage(self, name: str) -> None:
        """Drop a staged frame."""

    @contextmanager
    def staged(self, name: str, frame: Rows) -> Iterator[str]:
        """Stage ``frame`` as ``name`` for a ``with`` block; yields the quoted table name."""
        self.stage(name, frame)
        try:
            yield quote(name)
        except BaseException:
            # Inside a failed transaction the drop fails too; the first error is the one
            # worth reporting, and the rollback takes the temporary table with it.
            with suppress(Exception):
                self.unstage(name)
            raise
        self.unstage(name)

    def bulk_load(self, table: str, frame: Rows, *, maybe_empty: bool = True) -> bool:
        """Append ``frame`` to ``table`` (columns matched by name) on a bulk path, if any.

        Returns False (and reads nothing) when the backend has none better than ``INSERT ...
        SELECT`` from a staged frame; the caller then writes with SQL. Rows go in frame order.
        ``maybe_empty=False``: the caller knows the table holds rows, so no path for an empty
        table is looked for (the rows stored are the same either way).
        """
        return False

    def prepare_load_aside(self) -> None:
        """A ``bulk_load_aside`` is likely to come (a source's first sync): get ready for it
        now, while the sync fetches. Nothing to do where there is no such load."""
        return

    @contextmanager
    def bulk_load_aside(self, table: str, frame: Rows) -> Iterator[bool]:
        """Load ``frame`` into the empty ``table`` elsewhere while the ``with`` block runs.

        Yields True when the rows are on their way: they are in ``table``, in this connection's
        transaction, when the block ends. Yields False (and reads nothing) when the backend
        cannot, or not into this table (it holds rows, or it cannot be replaced by a copy);
        the caller then writes the rows itself.
        """
        yield False

    def make_room(self, value_bytes: int) -> None:
        """Let this connection write values of up to ``value_bytes`` (a sync's largest
        document), where the warehouse bounds its own memory. Nothing to do elsewhere."""
        return

    @abstractmethod
    def lock(self, key: str) -> None:
        """Hold an exclusive lock on ``key`` until the current transaction ends."""

    def try_hold(self, key: str) -> bool:
        """Take an exclusive lock on ``key`` for this connection, across transactions, without
        waiting: False when another connection holds it. ``release`` (or closing) gives it back.
        Call it outside a transaction. Where one process owns the database, always True."""
        return True

    def release(self, key: str) -> None:
        """Give back the lock ``try_hold`` took on ``key``."""
        return

    @abstractmethod
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Commit on success, roll back on any exception."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection."""

    def reset(self) -> bool:
        """Make this connection as good as new for another job (``warehouse.connection_pool``):
        no transaction left open, no session lock held. False when it cannot be (it is then
        to be closed); backends that are never reused say False."""
        return False

    @property
    def tables_key(self) -> str | None:
        """What names this warehouse's tables for a process-wide memo of the DDL already
        committed (warehouse/schema.py), or None for no memo: a DuckDB file's DDL is cheap in
        process, and a file may be removed and made anew under one path."""
        return None

    def after_commit(self, done: Callable[[], None]) -> None:
        """Call ``done`` once the current transaction commits (never if it rolls back)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no memo (tables_key is None)")

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DuckDBWarehouse(Warehouse):
    """A DuckDB file. One process may write it at a time (Dagster pools enforce that)."""

    dialect = "duckdb"
    # Raw payloads are most of a table's bytes and rarely read: zstd stores them in about 60%
    # of the space DuckDB's default string compression takes, and writes them faster.
    raw_storage = " USING COMPRESSION zstd"

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        import duckdb

        self.path = Path(path)
        if str(self.path) != ":memory:" and not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # The file is attached (not opened directly) to choose its row group size: a sync's
        # bulk write then fills row groups that DuckDB compresses and writes while the
        # INSERT runs, on all cores, instead of compressing one big row group at commit.
        catalog = self.path.stem if self.path.stem not in _RESERVED_CATALOGS else "warehouse"
        options = "READ_ONLY" if read_only else f"ROW_GROUP_SIZE {ROW_GROUP_ROWS}"
        # A bounded buffer pool: DuckDB otherwise keeps every block it wrote or read cached,
        # up to 80% of the machine's memory, so a sync's memory would follow the table size.
        # Beyond the limit it evicts cached blocks and spills to a temporary directory.
        self._con = duckdb.connect(config={"memory_limit": MEMORY_LIMIT})
        self._memory_limit = _MEMORY_LIMIT_BYTES  # raised by make_room
        try:
            self._con.execute(f"ATTACH {literal(str(self.path))} AS {quote(catalog)} ({options})")
        except duckdb.IOException as error:
            self._con.close()
            raise WarehouseError(_duckdb_open_problem(self.path, str(error))) from error
        self._con.execute(f"USE {quote(catalog)}")
        # Timestamps leave as UTC whatever the machine's zone, so both backends read the same.
        self._con.execute("SET TimeZone = 'UTC'")
        if read_only:
            # A sandbox for `changewatch sql`: no file, extension or database beyond the
            # warehouse (set after the ATTACH, which it would refuse), and no setting changes.
            self._con.execute("SET enable_external_access = false")
            self._con.execute("SET lock_configuration = true")

    def cancel(self) -> None:
        """Interrupt this connection's running statement (from any thread)."""
        self._con.interrupt()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._con.execute(sql, list(params))

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._con.execute(sql, list(params)).fetchall()

    def fetch_frame(self, sql: str, params: Sequence[Any] = ()) -> pl.DataFrame:
        return pl.from_arrow(self._con.sql(sql, params=list(params)).to_arrow_table())

    def fetch_batches(self, sql: str, params: Sequence[Any] = ()) -> pa.RecordBatchReader:
        return self._con.sql(sql, params=list(params)).to_arrow_reader(ROW_GROUP_ROWS)

    def stage(self, name: str, frame: Rows) -> None:
        # A registered Arrow view: DuckDB scans it in place, nothing is copied or written.
        self._con.register(name, _record_batches(frame))

    def unstage(self, name: str) -> None:
        self._con.unregister(name)

    def make_room(self, value_bytes: int) -> None:
        # One value is allocated whole, rounded up to a power of two, and cannot spill: a
        # 100 MB value failed in 128 MB. For the rest of this connection's life (one sync's).
        limit = max(_MEMORY_LIMIT_BYTES, _VALUE_ROOM * value_bytes)
        if limit > self._memory_limit:
            self._con.execute(f"SET memory_limit = '{limit // 1024}KiB'")
            self._memory_limit = limit

    def lock(self, key: str) -> None:
        # DuckDB allows one writing process per file, so holding the file is the lock.
        return None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self._con.begin()
        try:
            yield
        except BaseException:
            self._con.rollback()
            raise
        self._con.commit()

    def close(self) -> None:
        self._con.close()


class PostgresWarehouse(Warehouse):
    """A PostgreSQL database, reached with ADBC so frames move as Arrow over binary COPY."""

    dialect = "postgres"
    loads_aside = True

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        from .pg_connections import connect

        self._url = url  # for a sibling connection; may hold a password, never shown
        # A sibling connection being opened ahead of a load aside (prepare_load_aside).
        self._spare: Future[PostgresWarehouse] | None = None
        # Work to do once the current transaction has rolled back (see bulk_load_aside).
        self._on_rollback: list[Callable[[], None]] = []
        # Work to do once the current transaction has committed (see after_commit).
        self._on_commit: list[Callable[[], None]] = []
        # Session locks taken by try_hold and not yet released (a connection holding one is
        # not reused: see reset).
        self._held: set[str] = set()
        uri, schema = _split_schema(url)
        try:
            # A read-only session is a person's query (`changewatch sql`): the server's
            # catalogue types what it selects; the warehouse's own columns are built-in types.
            self._con = connect(uri, server_types=read_only)
        except Exception as error:  # the driver raises its own hierarchy; name the host only
            raise WarehouseError(
                f"cannot connect to PostgreSQL at {describe_url(url)}: {_libpq_reason(error)}"
            ) from error
        self._cur = self._con.cursor()
        self.schema = schema
        if read_only:
            # Every later transaction of this session is read-only: the server refuses writes.
            self._cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        if schema:
            if not read_only:
                self._create_schema(schema)
            self._cur.execute(f'SET search_path TO "{schema}"')
        self._con.commit()

    def _create_schema(self, schema: str) -> None:
        """Create ``schema`` unless it exists. Two sessions creating it at once (syncs of a
        batch on a fresh warehouse) may both pass IF NOT EXISTS, and the loser's insert into
        the catalog fails: the schema it wanted is there, so that is success."""
        try:
            self._cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            self._con.commit()
        except Exception:
            self._con.rollback()
            found = self.fetch("SELECT 1 FROM pg_namespace WHERE nspname = $1", (schema,))
            if not found:
                raise

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._cur.execute(sql, tuple(params) or None)

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._cur.execute(sql, tuple(params) or None)
        return self._cur.fetchall()

    def fetch_frame(self, sql: str, params: Sequence[Any] = ()) -> pl.DataFrame:
        self._cur.execute(sql, tuple(params) or None)
        return pl.from_arrow(self._cur.fetch_arrow_table())

    def fetch_batches(self, sql: str, params: Sequence[Any] = ()) -> pa.RecordBatchReader:
        self._cur.execute(sql, tuple(params) or None)
        return self._cur.fetch_record_batch()

    def stage(self, name: str, frame: Rows) -> None:
        self._cur.adbc_ingest(name, _record_batches(frame), mode="create", temporary=True)

    def unstage(self, name: str) -> None:
        self._cur.execute(f"DROP TABLE IF EXISTS pg_temp.{quote(name)}")

    def bulk_load(self, table: str, frame: Rows, *, maybe_empty: bool = True) -> bool:
        # Binary COPY straight into the table: one pass, where staging would COPY into a
        # temporary table and then INSERT ... SELECT. Text goes into json columns as is.
        key = self._primary_key_if_empty(table) if maybe_empty else None
        if key is None:
            self._cur.adbc_ingest(table, _record_batches(frame), mode="append")
            return True
        # An empty table (a source's first sync): its primary key is built once after the
        # COPY, from one sort, instead of by an index insert per row (about a tenth of the
        # server's work on the COPY). The DDL is part of the transaction: a failed load
        # leaves the key as it was, and rebuilding it checks the keys are unique.
        name, definition = key
        self._cur.execute(f"ALTER TABLE {quote(table)} DROP CONSTRAINT {quote(name)}")
        self._cur.adbc_ingest(table, _record_batches(frame), mode="append")
        self._cur.execute(f"ALTER TABLE {quote(table)} ADD CONSTRAINT {quote(name)} {definition}")
        return True

    @contextmanager
    def bulk_load_aside(self, table: str, frame: Rows) -> Iterator[bool]:
        # A first sync's table and change log are two COPYs whose cost is the server's CPU,
        # one backend each: a second connection loads the table into a copy of it while this
        # one writes the change log, and the copy then takes the table's place in this
        # transaction. Only a table nothing else refers to can be replaced so.
        key = self._primary_key_if_empty(table)
        if key is None or self._drop_blockers(table):
            yield False
            return
        stage = _load_name("_cw_load_", table)
        # The loader commits the copy: if this transaction fails, even after the swap (which
        # the rollback undoes), the copy must go too. A killed process leaves it to the next
        # sync of the source, which drops it first.
        self._on_rollback.append(lambda: self._drop_load_table(stage))
        with self.sibling() as loader, ThreadPoolExecutor(1, "changewatch-load") as pool:
            loading = pool.submit(_load_copy, loader, table, stage, key[1], frame)
            try:
                yield True
            except BaseException:
                with suppress(Exception):
                    loader.cancel()  # no use finishing a load whose sync failed
                wait([loading])
                raise
            loading.result()  # the loader's error, if any, fails the sync
        self._swap_in(table, stage, key)

    def _swap_in(self, table: str, stage: str, key: tuple[str, str]) -> None:
        """Replace the empty ``table`` by the loaded ``stage`` and give it ``key`` back; or,
        if the table changed during the load, insert the stage's rows into it."""
        self._cur.execute(f"LOCK TABLE {quote(table)} IN ACCESS EXCLUSIVE MODE")
        if self._primary_key_if_empty(table) == key and not self._drop_blockers(table):
            self._cur.execute(f"DROP TABLE {quote(table)}")
            self._cur.execute(f"ALTER TABLE {quote(stage)} RENAME TO {quote(table)}")
            # The key the loader built takes the name of the one dropped with the table.
            self._cur.execute(
                f"ALTER TABLE {quote(table)} RENAME CONSTRAINT "
                f"{quote(_load_name('_cw_key_', table))} TO {quote(key[0])}"
            )
            return
        columns = self.fetch(render("select_columns_table", self.dialect), (stage,))
        self._cur.execute(
            render(
                "insert_entity_load",
                self.dialect,
                table=quote(table),
                stage=quote(stage),
                columns=", ".join(quote(c) for (c,) in columns),
            )
        )
        self._cur.execute(render("drop_load_entity", self.dialect, stage=quote(stage)))

    def _drop_blockers(self, table: str) -> list[str]:
        """Why ``table`` cannot be dropped and recreated without loss (empty: it can)."""
        rows = self.fetch(render("select_drop_blockers_entity", self.dialect), (quote(table),))
        return [row[0] for row in rows]

    def _drop_load_table(self, stage: str) -> None:
        # After a rollback: its own small transaction. Best effort, the next sync drops it too.
        try:
            self._cur.execute(render("drop_load_entity", self.dialect, stage=quote(stage)))
            self._con.commit()
        except Exception:  # noqa: BLE001 - the sync's own error is the one to report
            with suppress(Exception):
                self._con.rollback()

    def prepare_load_aside(self) -> None:
        # Connecting takes some 50 ms, mostly waiting: done while the walk goes on, not
        # between the walk and the load.
        if self._spare is None:
            self._spare = Future()
            threading.Thread(
                target=_connect_into,
                args=(self._spare, self._url),
                name="changewatch-connect",
                daemon=True,  # a connect that hangs must not keep the process alive
            ).start()

    def sibling(self) -> PostgresWarehouse:
        """A second connection to the same database and schema, with its own transactions."""
        spare, self._spare = self._spare, None
        if spare is not None:
            with suppress(Exception):  # it failed: connect again, for the error to tell
                return spare.result()
        return PostgresWarehouse(self._url)

    def cancel(self) -> None:
        """Ask the server to cancel this connection's running statement (from any thread)."""
        self._con.adbc_cancel()

    def _primary_key_if_empty(self, table: str) -> tuple[str, str] | None:
        """The name and definition of ``table``'s primary key, if it holds no row."""
        self._cur.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = CAST($1 AS regclass) AND contype = 'p' "
            f"AND NOT EXISTS (SELECT FROM {quote(table)})",
            (quote(table),),
        )
        row = self._cur.fetchone()
        return (row[0], row[1]) if row else None

    def _lock_id(self, key: str) -> str:
        # Advisory locks are per database, and one database may hold several warehouses (one
        # per schema, as the tests and shared deployments do): the schema is part of the key.
        return f"{self.schema or ''}/{key}"

    def lock(self, key: str) -> None:
        self._cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", (self._lock_id(key),)
        )

    def try_hold(self, key: str) -> bool:
        # A session lock: it outlives the transaction it is taken in (and a rollback).
        with self.transaction():
            row = self.fetch(
                "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", (self._lock_id(key),)
            )
        if row[0][0]:
            self._held.add(key)
        return bool(row[0][0])

    def release(self, key: str) -> None:
        with self.transaction():
            self.execute(
                "SELECT pg_advisory_unlock(hashtextextended($1, 0))", (self._lock_id(key),)
            )
        self._held.discard(key)

    def reset(self) -> bool:
        # A read outside transaction() leaves one open (ADBC is not in autocommit): ended
        # here, so an idle connection holds no snapshot or lock. Temporary tables are staged
        # for one block and dropped after it (Warehouse.staged); a block that failed closed
        # its connection instead of giving it back.
        if self._held or self._on_commit or self._on_rollback:
            return False
        try:
            self._con.rollback()
        except Exception:  # noqa: BLE001 - a connection in doubt is closed, not reused
            return False
        return True

    @property
    def tables_key(self) -> str:
        return self._url  # the database and the schema; a memo key, never shown

    def after_commit(self, done: Callable[[], None]) -> None:
        self._on_commit.append(done)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        # ADBC connections start with autocommit off: everything until commit is one transaction.
        try:
            yield
            self._con.commit()
            for done in self._on_commit:
                done()
        except BaseException as error:
            try:
                self._con.rollback()
            except Exception:
                # No connection left to roll back on: the server has rolled the transaction
                # back itself. What is worth telling is the loss, not the failed rollback.
                raise ConnectionLost(
                    f"the connection to PostgreSQL at {describe_url(self._url)} was lost "
                    f"({_libpq_reason(_first_line_error(error))})"
                ) from error
            finally:
                for undo in self._on_rollback:
                    undo()
            raise
        finally:
            self._on_rollback.clear()
            self._on_commit.clear()

    def close(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            with suppress(Exception):
                spare.result().close()
        self._cur.close()
        self._con.close()


def _connect_into(future: Future[PostgresWarehouse], url: str) -> None:
    """Open a connection to ``url`` into ``future`` (on a thread of its own)."""
    try:
        future.set_result(PostgresWarehouse(url))
    except BaseException as error:  # noqa: BLE001 - handed over, raised where it is used
        future.set_exception(error)


def _load_name(prefix: str, table: str) -> str:
    """The name of what a first sync of ``table`` builds on its second connection (the table,
    its key): one per source table, within PostgreSQL's 63 bytes (a long name is cut and told
    apart by a hash).

    >>> _load_name("_cw_load_", "issues")
    '_cw_load_issues'
    >>> name = _load_name("_cw_load_", "x" * 60); len(name), name[-9:]
    (63, '_42f2d973')
    """
    name = f"{prefix}{table}"
    if len(name.encode()) <= 63:
        return name
    digest = hashlib.sha256(table.encode()).hexdigest()[:8]
    head = name.encode()[: 63 - 9].decode(errors="ignore")  # never half a character
    return f"{head}_{digest}"


def _load_copy(loader: PostgresWarehouse, table: str, stage: str, key: str, frame: Rows) -> None:
    """On ``loader`` (a sibling connection, its own thread): replace any leftover ``stage``
    by an empty copy of ``table``, COPY ``frame`` into it, give it primary key ``key`` (a
    definition) and commit."""
    with loader.transaction():
        loader.execute(f"SET LOCAL lock_timeout = '{_LOAD_LOCK_TIMEOUT}'")
        loader.execute(render("drop_load_entity", loader.dialect, stage=quote(stage)))
        loader.execute(
            render("create_load_entity", loader.dialect, stage=quote(stage), table=quote(table))
        )
        loader.bulk_load(stage, frame)
        # Built here, from one sort after the COPY and while the change log is still being
        # written: the check that the keys are unique fails the load, not the swap.
        name = quote(_load_name("_cw_key_", table))
        loader.execute(f"ALTER TABLE {quote(stage)} ADD CONSTRAINT {name} {key}")


def _record_batches(frame: Rows) -> pa.Table | pa.RecordBatchReader:
    """``frame`` as Arrow in row-group-sized record batches (a reader passes as it is).

    DuckDB scans, casts and compresses the batches on every core (one batch would keep a bulk
    write on one thread); PostgreSQL's binary COPY is sent batch by batch, so the server
    stores one while the driver encodes the next.
    """
    if isinstance(frame, pa.RecordBatchReader):
        return frame
    table = frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame
    return pa.Table.from_batches(table.to_batches(max_chunksize=ROW_GROUP_ROWS), table.schema)


def connect(url: str | None = None, *, read_only: bool = False) -> Warehouse:
    """Open the warehouse at ``url`` (or ``$CHANGEWATCH_WAREHOUSE_URL``, or the DuckDB default).

    ``duckdb:///relative/path.duckdb``, ``duckdb:////absolute/path.duckdb`` or a bare path
    ending in ``.duckdb`` open DuckDB; ``postgresql://...`` opens PostgreSQL, where an extra
    ``schema=name`` query parameter selects (and creates) the schema used. ``read_only``:
    the database itself refuses every write (DuckDB attaches the file read-only, PostgreSQL
    makes the session's transactions read-only); nothing is created. A read-only DuckDB
    connection reaches no other file and cannot change its settings.
    """
    url = url or os.environ.get("CHANGEWATCH_WAREHOUSE_URL") or DEFAULT_URL
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg2://")):
        return PostgresWarehouse(
            url.replace("postgresql+psycopg2://", "postgresql://", 1), read_only=read_only
        )
    return DuckDBWarehouse(duckdb_path(url), read_only=read_only)


def _duckdb_open_problem(path: Path, message: str) -> str:
    """What went wrong opening a DuckDB file, in a user's terms.

    >>> _duckdb_open_problem(Path("w.duckdb"), 'IO Error: Could not set lock on file '
    ...     '"w.duckdb": Conflicting lock is held in /usr/bin/python3 (PID 42). See also ...')
    'DuckDB file w.duckdb is locked: another process (PID 42) has it open; retry when it is done'
    """
    if "Conflicting lock" in message:
        pid = re.search(r"\(PID (\d+)\)", message)
        who = f"another process (PID {pid[1]})" if pid else "another process"
        return f"DuckDB file {path} is locked: {who} has it open; retry when it is done"
    if "database does not exist" in message:
        return f"no DuckDB warehouse at {path} yet: `changewatch sync` creates it"
    return f"cannot open DuckDB file {path}: {message.splitlines()[0] if message else ''}"


def _first_line_error(error: BaseException) -> Exception:
    """``error``'s first line, as an error for ``_libpq_reason`` (libpq adds lines of advice)."""
    return Exception((str(error).strip().splitlines() or [type(error).__name__])[0])


def _libpq_reason(error: Exception) -> str:
    """The server's or libpq's reason, without the driver's prefixes, on one line.

    >>> _libpq_reason(Exception('IO: [libpq] Failed to connect: connection to server at '
    ...     '"h", port 5432 failed: FATAL:  database "nope" does not exist\\n'))
    'database "nope" does not exist'
    """
    text = " ".join(str(error).split())
    for marker in ("FATAL:", "failed:", "[libpq]"):
        if marker in text:
            return text.rpartition(marker)[2].strip() or text
    return text


def _split_schema(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    schema = next((value for key, value in query if key == "schema"), None)
    if schema is not None and not _SCHEMA.match(schema):
        raise WarehouseError(f"schema {schema!r} in the warehouse URL is not a plain identifier")
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema
