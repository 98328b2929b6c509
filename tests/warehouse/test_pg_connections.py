"""A process's PostgreSQL connections share one ADBC database handle (warehouse/pg_connections.py),
which reads no type catalogue unless asked to (``server_types``, for `changewatch sql`).

Checked on a real server by what it sees: the driver reads pg_type when a handle that uses the
server's types opens, so PostgreSQL's own scan counters of pg_type (pg_stat_sys_tables, per
database) show how many such handles were opened. Each test has a database of its own, so other
tests' scans are not counted.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

import adbc_driver_postgresql.dbapi as adbc
import psycopg2
import pytest
from changewatch.warehouse import backends, pg_connections
from changewatch.warehouse.backends import WarehouseError
from cw_testing import fresh_database


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh PostgreSQL database; its URL."""
    with fresh_database("cw_connect") as url:
        yield url


def pg_type_scans(url: str) -> int:
    """Whole-table scans of pg_type in ``url``'s database so far (the driver reads the whole
    table; a new session's own catalogue lookups go by index), once every other session ended:
    a session reports its counters as it ends, before it leaves pg_stat_activity."""
    wait_for_sessions(url, 0)
    with closing(psycopg2.connect(url)) as db, db.cursor() as cur:
        cur.execute("SELECT seq_scan FROM pg_stat_sys_tables WHERE relname = 'pg_type'")
        return cur.fetchone()[0]


def sessions(url: str) -> int:
    """Client sessions now open on ``url``'s database, besides the one asking."""
    with closing(psycopg2.connect(url)) as db, db.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return cur.fetchone()[0]


def wait_for_sessions(url: str, count: int) -> int:
    """The client sessions on ``url``'s database, once they are ``count`` (or after 10 s): a
    closed session's server process ends a moment after its client let go."""
    deadline = time.time() + 10
    while (now := sessions(url)) != count and time.time() < deadline:
        time.sleep(0.05)
    return now


def select_one(connect, url: str) -> int:
    with closing(connect(url)) as con, con.cursor() as cur:
        cur.execute("SELECT 1")
        return cur.fetchone()[0]


def connector(server_types: bool):
    """The process's connect, to handles of built-in types or of the server's."""
    return functools.partial(pg_connections.connect, server_types=server_types)


@pytest.mark.parametrize("server_types", [False, True], ids=["builtin", "server-types"])
def test_no_connection_reads_the_type_catalogue_once_its_handle_is_open(
    database: str, server_types: bool
) -> None:
    """A warehouse connection never reads it, not even the first; a server-typed handle reads
    it when it opens, its later connections not again."""
    connect = connector(server_types)
    if server_types:
        select_one(connect, database)  # opens the process's handle
    before = pg_type_scans(database)
    for _ in range(5):
        assert select_one(connect, database) == 1
    assert pg_type_scans(database) == before
    # The driver's own connect reads it every time: what the handles save.
    for _ in range(5):
        assert select_one(adbc.connect, database) == 1
    assert pg_type_scans(database) >= before + 5


def test_the_handle_holds_no_session(database: str) -> None:
    con = pg_connections.connect(database)
    assert wait_for_sessions(database, 1) == 1  # the connection's; the handle's read is over
    con.close()
    assert wait_for_sessions(database, 0) == 0


@pytest.mark.parametrize("server_types", [False, True], ids=["builtin", "server-types"])
def test_threads_connect_and_close_at_once(database: str, server_types: bool) -> None:
    """Eight threads opening and closing connections of one handle: each works, the catalogue
    is read once at most, and every connection's reference to the handle is given back."""
    connect = connector(server_types)
    before = pg_type_scans(database)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: select_one(connect, database), range(200)))
    assert results == [1] * 200
    opened = pg_type_scans(database) - before
    select_one(adbc.connect, database)  # what opening one handle scans
    assert opened == (pg_type_scans(database) - before - opened if server_types else 0)
    assert pg_type_scans(database) > before + opened
    # Only the cache's own reference is left, and the handle still opens connections.
    assert pg_connections._handles[database, server_types].shared._refcount == 1
    assert select_one(connect, database) == 1


def test_a_table_made_after_the_handle_opened_reads_back(database: str) -> None:
    """The handle's type map is read once: a later table's columns must still read."""
    select_one(pg_connections.connect, database)
    with closing(pg_connections.connect(database)) as con, con.cursor() as cur:
        cur.execute(
            "CREATE TABLE later (id bigint, body text, payload jsonb, seen timestamptz, "
            "amount numeric(12, 2), labels text[], raw bytea, done boolean)"
        )
        cur.execute(
            "INSERT INTO later VALUES (1, 'b', '{\"a\": 1}', '2026-01-02 03:04:05+00', 1.5, "
            "ARRAY['x', 'y'], '\\x0102', true)"
        )
        con.commit()
    with closing(pg_connections.connect(database)) as con, con.cursor() as cur:
        cur.execute("SELECT * FROM later")
        row = cur.fetch_arrow_table().to_pylist()[0]
    assert row["id"] == 1 and row["body"] == "b" and row["labels"] == ["x", "y"]
    assert row["raw"] == b"\x01\x02" and row["done"] is True
    assert str(row["amount"]) == "1.5" or float(row["amount"]) == 1.5
    assert row["payload"] == '{"a": 1}' and row["seen"].year == 2026


def test_a_read_only_session_reads_types_of_the_users_own(database: str) -> None:
    """`changewatch sql` (a read-only session) shows an enum of the user's own as its label;
    the warehouse's own sessions, on built-in types only, would see opaque bytes."""
    with closing(psycopg2.connect(database)) as db, db.cursor() as cur:
        cur.execute("CREATE TYPE mood AS ENUM ('calm', 'cross')")
        cur.execute("CREATE TABLE moods AS SELECT 'calm'::mood AS mood")
        db.commit()
    with closing(backends.connect(database, read_only=True)) as wh:
        assert wh.fetch("SELECT mood FROM moods") == [("calm",)]
    with closing(pg_connections.connect(database)) as con, con.cursor() as cur:
        cur.execute("SELECT mood FROM moods")
        assert cur.fetchall()[0][0] != "calm"


def test_a_failed_open_is_named_and_not_kept() -> None:
    """An unreachable server is the warehouse's usual one-line error, every time."""
    url = "postgresql://postgres@127.0.0.1:1/nowhere"
    for _ in range(2):
        with pytest.raises(WarehouseError, match="cannot connect to PostgreSQL at .*127.0.0.1:1"):
            backends.connect(url)
    assert pg_connections._handles[url, False].shared is None  # tried again at the next connect
