"""A first sync on PostgreSQL loads its table on a second connection and swaps it in: the same
rows, change log and table definition as a load in place, nothing of a user's lost, nothing
left behind when it fails."""

from __future__ import annotations

import time
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from changewatch.warehouse.backends import PostgresWarehouse
from changewatch.warehouse.schema import ensure_bookkeeping, ensure_source_tables
from changewatch.warehouse.sync import run_sync
from cw_testing import PG_URL
from test_sync import demo_source

# What defines a table beyond its rows: columns (with defaults, storage, compression),
# constraints, indexes, grants, comments and the views over it.
DEFINITION = {
    "columns": "SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
    "a.attstorage, a.attcompression, pg_get_expr(d.adbin, d.adrelid), c.is_nullable, "
    "c.data_type, c.column_default FROM pg_attribute AS a "
    "LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    "JOIN information_schema.columns AS c ON c.table_schema = current_schema() "
    "AND c.table_name = 'issues' AND c.column_name = a.attname "
    "WHERE a.attrelid = 'issues'::regclass AND a.attnum > 0 ORDER BY 1",
    "constraints": "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
    "WHERE conrelid = 'issues'::regclass ORDER BY 1",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes "
    "WHERE schemaname = current_schema() AND tablename = 'issues' ORDER BY 1",
    "grants": "SELECT relacl::text FROM pg_class WHERE oid = 'issues'::regclass",
    "comment": "SELECT obj_description('issues'::regclass, 'pg_class')",
    "views": "SELECT viewname FROM pg_views WHERE schemaname = current_schema()",
}


def prepared(url: str, api: DemoAPIServer, *statements: str) -> PostgresWarehouse:
    """The demo source's tables created empty in ``url``, then ``statements`` run on them."""
    wh = connect(url)
    assert isinstance(wh, PostgresWarehouse)
    with wh.transaction():
        ensure_bookkeeping(wh)
        ensure_source_tables(wh, demo_source(api).config)
        for statement in statements:
            wh.execute(statement)
    return wh


def definition(wh: PostgresWarehouse) -> dict[str, list[tuple[Any, ...]]]:
    return {name: wh.fetch(query) for name, query in DEFINITION.items()}


def table_oid(wh: PostgresWarehouse) -> int:
    return wh.fetch("SELECT 'issues'::regclass::oid")[0][0]


def load_tables(wh: PostgresWarehouse) -> list[tuple[Any, ...]]:
    return wh.fetch(
        "SELECT tablename FROM pg_tables "
        "WHERE schemaname = current_schema() AND tablename LIKE '\\_cw\\_load\\_%'"
    )


def stored(wh: PostgresWarehouse) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The source table and change log, less what differs between any two syncs."""
    rows = wh.fetch_frame("SELECT * FROM issues ORDER BY number").drop("_synced_at")
    log = wh.fetch_frame("SELECT * FROM issues_changes ORDER BY change_id")
    return rows, log.drop("sync_id", "detected_at")


# Things a user may do to a source's table that a copy keeps: the load still swaps.
KEPT_BY_THE_COPY = (
    "ALTER TABLE issues ALTER COLUMN _raw SET COMPRESSION lz4",
    "ALTER TABLE issues ALTER COLUMN title SET STORAGE EXTERNAL",
    "ALTER TABLE issues ADD CONSTRAINT comments_counted CHECK (comments >= 0)",
    "ALTER TABLE issues ALTER COLUMN state SET DEFAULT 'open'",
)


def test_first_sync_swaps_in_what_a_load_in_place_stores(
    pg_url: str, demo_api: DemoAPIServer
) -> None:
    in_place_url = pg_url.replace("?schema=", "?schema=inplace_")
    try:
        # A comment on the table keeps the load in place (a copy would lose it).
        with prepared(
            in_place_url, demo_api, *KEPT_BY_THE_COPY, "COMMENT ON TABLE issues IS 'mine'"
        ) as wh:
            before = table_oid(wh)
            run_sync(wh, demo_source(demo_api))
            assert table_oid(wh) == before
            expected = stored(wh)
        with prepared(pg_url, demo_api, *KEPT_BY_THE_COPY) as wh:
            created, before = definition(wh), table_oid(wh)
            stats = run_sync(wh, demo_source(demo_api))
            assert stats.inserted == stats.row_count == 40
            assert table_oid(wh) != before  # the loaded copy took the table's place
            assert definition(wh) == created
            rows, log = stored(wh)
            assert rows.equals(expected[0]) and log.equals(expected[1])
            assert rows.height == 40 and log.height == 40
            assert load_tables(wh) == []
            # The rebuilt primary key holds.
            with pytest.raises(Exception, match="duplicate key"), wh.transaction():
                wh.execute("INSERT INTO issues SELECT * FROM issues WHERE number = 1")
            demo_api.tracker.mutate(update=2, create=1)
            assert run_sync(wh, demo_source(demo_api)).changed == 3
    finally:
        with connect(PG_URL) as wh, wh.transaction():
            wh.execute(f'DROP SCHEMA IF EXISTS "{in_place_url.rsplit("=", 1)[1]}" CASCADE')


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE INDEX issues_by_state ON issues (state)",
        "CREATE VIEW open_issues AS SELECT number FROM issues WHERE state = 'open'",
        "GRANT SELECT ON issues TO PUBLIC",
    ],
    ids=["index", "view", "grant"],
)
def test_what_a_user_added_to_the_empty_table_survives_the_first_sync(
    pg_url: str, demo_api: DemoAPIServer, statement: str
) -> None:
    with prepared(pg_url, demo_api, statement) as wh:
        created = definition(wh)
        run_sync(wh, demo_source(demo_api))
        assert definition(wh) == created
        assert wh.fetch("SELECT count(*), count(DISTINCT number) FROM issues") == [(40, 40)]
        assert load_tables(wh) == []


def test_a_leftover_load_table_is_replaced(pg_url: str, demo_api: DemoAPIServer) -> None:
    # As a killed sync would leave it (here with another layout, rows and a reader's grant).
    with prepared(
        pg_url,
        demo_api,
        "CREATE TABLE _cw_load_issues (junk TEXT)",
        "INSERT INTO _cw_load_issues VALUES ('left over')",
    ) as wh:
        run_sync(wh, demo_source(demo_api))
        assert wh.fetch("SELECT count(*) FROM issues") == [(40,)]
        assert load_tables(wh) == []


# -- the backend's load aside, driven directly -----------------------------------------------


def items(wh: PostgresWarehouse) -> None:
    with wh.transaction():
        wh.execute("CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT NOT NULL)")


def rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})


def test_a_table_indexed_during_the_load_gets_the_rows_inserted(pg_url: str) -> None:
    with connect(pg_url) as wh, connect(pg_url) as other:
        assert isinstance(wh, PostgresWarehouse)
        items(wh)
        with wh.transaction(), wh.bulk_load_aside("items", rows([1, 2, 3])) as loading:
            assert loading
            with other.transaction():
                other.execute("CREATE INDEX items_by_name ON items (name)")
        assert wh.fetch("SELECT id FROM items ORDER BY id") == [(1,), (2,), (3,)]
        indexes = wh.fetch(
            "SELECT indexname FROM pg_indexes "
            "WHERE schemaname = current_schema() AND tablename = 'items' ORDER BY 1"
        )
        assert indexes == [("items_by_name",), ("items_pkey",)]
        assert load_tables(wh) == []


def assert_untouched(wh: PostgresWarehouse, oid: int) -> None:
    """``items`` is the table it was, empty, with its key, and no load table is left."""
    assert table_oid_of(wh, "items") == oid
    assert wh.fetch("SELECT count(*) FROM items") == [(0,)]
    assert wh.fetch(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'items'::regclass AND contype = 'p'"
    ) == [("items_pkey",)]
    assert load_tables(wh) == []


def table_oid_of(wh: PostgresWarehouse, name: str) -> int:
    return wh.fetch("SELECT $1::regclass::oid", (name,))[0][0]


def test_a_duplicate_key_fails_the_load_and_leaves_the_table_empty(pg_url: str) -> None:
    with connect(pg_url) as wh:
        assert isinstance(wh, PostgresWarehouse)
        items(wh)
        oid = table_oid_of(wh, "items")
        with (
            pytest.raises(Exception, match="could not create unique index"),
            wh.transaction(),
            wh.bulk_load_aside("items", rows([1, 2, 2])) as loading,
        ):
            assert loading
        assert_untouched(wh, oid)


def test_a_failed_load_fails_the_sync_and_leaves_the_table_empty(pg_url: str) -> None:
    with connect(pg_url) as wh:
        assert isinstance(wh, PostgresWarehouse)
        items(wh)
        oid = table_oid_of(wh, "items")
        nameless = pa.table({"id": pa.array([1, 2], pa.int64()), "name": [None, "b"]})
        with (
            pytest.raises(Exception, match="not-null"),
            wh.transaction(),
            wh.bulk_load_aside("items", nameless),
        ):
            pass
        assert_untouched(wh, oid)


@pytest.mark.parametrize("where", ["during the load", "after the swap"])
def test_a_failure_of_the_sync_itself_leaves_the_table_empty(pg_url: str, where: str) -> None:
    with connect(pg_url) as wh:
        assert isinstance(wh, PostgresWarehouse)
        items(wh)
        oid = table_oid_of(wh, "items")
        with pytest.raises(RuntimeError, match="the change log"), wh.transaction():
            with wh.bulk_load_aside("items", rows(list(range(50_000)))):
                if where == "during the load":
                    raise RuntimeError("the change log failed")
            assert wh.fetch("SELECT count(*) FROM items") == [(50_000,)]
            raise RuntimeError("the change log failed")
        assert_untouched(wh, oid)


BACKEND_START = "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"


def test_the_second_connection_is_opened_while_the_sync_fetches(pg_url: str) -> None:
    # A first sync asks for it before its walk; the load then finds it open.
    with connect(pg_url) as wh:
        assert isinstance(wh, PostgresWarehouse)
        wh.prepare_load_aside()
        wh.prepare_load_aside()  # once is enough: still one spare
        time.sleep(0.5)
        asked = wh.fetch("SELECT clock_timestamp()")[0][0]
        with wh.sibling() as spare:
            assert spare.fetch(BACKEND_START)[0][0] < asked
            assert spare.fetch("SELECT current_schema()") == wh.fetch("SELECT current_schema()")
        with wh.sibling() as fresh:  # the spare is used once
            assert fresh.fetch(BACKEND_START)[0][0] > asked
