"""A sync against the demo API, on DuckDB and on PostgreSQL: rows, change log, cursor, runs."""

from __future__ import annotations

import threading
from typing import Any

import polars as pl
import pytest
from changewatch.sources.demo import DemoAPIServer
from changewatch.sources.errors import FetchError, PayloadError
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import SyncSkipped, run_sync
from cw_testing import PG_URL, demo_source_settings

COLUMNS: dict[str, Any] = {
    "number": "bigint",
    "title": "text",
    "state": "text",
    "labels": {"type": "text[]", "path": "labels[].name"},
    "assignee": {"type": "text", "path": "assignee.login"},
    "comments": "integer",
    "created_at": "timestamp",
    "updated_at": "timestamp",
}


def demo_source(api: DemoAPIServer, **overrides: Any) -> RestSource:
    overrides.setdefault(
        "params", {"state": "all", "per_page": 15, "sort": "created", "direction": "asc"}
    )
    columns = overrides.pop("columns", COLUMNS)
    return RestSource(
        RestSourceConfig.model_validate(demo_source_settings(api.url, columns, **overrides))
    )


def incremental_source(api: DemoAPIServer) -> RestSource:
    return demo_source(
        api,
        sync="incremental",
        incremental={"param": "since"},
        params={"state": "all", "per_page": 15, "sort": "updated", "direction": "asc"},
    )


def changes(wh: Any) -> pl.DataFrame:
    return wh.fetch_frame("SELECT * FROM issues_changes ORDER BY change_id")


def table(wh: Any) -> pl.DataFrame:
    return wh.fetch_frame("SELECT * FROM issues ORDER BY number")


def test_first_sync_then_no_change_then_exact_changes(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = demo_source(demo_api)
    with connect(warehouse_url) as wh:
        first = run_sync(wh, source)
        assert (first.inserted, first.updated, first.deleted) == (40, 0, 0)
        assert first.pages == 3 and first.rows_fetched == 40 and first.row_count == 40
        log = changes(wh)
        assert log.height == 40 and set(log["kind"]) == {"insert"}
        assert sorted(log["object_key"].cast(int)) == list(range(1, 41))

        second = run_sync(wh, source)
        assert (second.inserted, second.updated, second.deleted, second.unchanged) == (0, 0, 0, 40)
        assert changes(wh).height == 40

        mutation = demo_api.tracker.mutate(update=4, delete=2, create=3)
        third = run_sync(wh, source)
        assert (third.inserted, third.updated, third.deleted) == (3, 4, 2)
        new = changes(wh).filter(pl.col("sync_id") == third.sync_id)
        by_kind = {
            k: sorted(new.filter(pl.col("kind") == k)["object_key"].cast(int))
            for k in ("insert", "update", "delete")
        }
        assert by_kind == {
            "insert": sorted(mutation["created"]),
            "update": sorted(mutation["updated"]),
            "delete": sorted(mutation["deleted"]),
        }
        # The stored table is exactly the upstream state now.
        stored = table(wh)
        upstream = sorted(issue["number"] for issue in demo_api.tracker.snapshot())
        assert stored["number"].to_list() == upstream
        assert stored["number"].n_unique() == stored.height


def test_change_log_holds_old_and_new_values(warehouse_url: str, demo_api: DemoAPIServer) -> None:
    source = demo_source(demo_api)
    with connect(warehouse_url) as wh:
        run_sync(wh, source)
        before = {row["number"]: row for row in table(wh).to_dicts()}
        mutation = demo_api.tracker.mutate(update=1, delete=1)
        sync = run_sync(wh, source)
        log = changes(wh).filter(pl.col("sync_id") == sync.sync_id)
        (updated,) = mutation["updated"]
        (deleted,) = mutation["deleted"]
        update = log.filter(pl.col("kind") == "update").to_dicts()[0]
        after = demo_api.tracker.get(updated)
        assert update["old_comments"] == before[updated]["comments"]
        assert update["new_comments"] == after["comments"]
        assert update["old_hash"] == before[updated]["_content_hash"] != update["new_hash"]
        assert "comments" in update["changed_columns"] and "updated_at" in update["changed_columns"]
        assert "number" not in update["changed_columns"]
        delete = log.filter(pl.col("kind") == "delete").to_dicts()[0]
        assert delete["old_title"] == before[deleted]["title"]
        assert delete["new_title"] is None and delete["new_hash"] is None


def test_cursor_and_runs_are_recorded(warehouse_url: str, demo_api: DemoAPIServer) -> None:
    source = demo_source(demo_api)
    with connect(warehouse_url) as wh:
        stats = run_sync(wh, source)
        newest = max(issue["updated_at"] for issue in demo_api.tracker.snapshot())
        assert stats.cursor_after == newest
        state = wh.fetch("SELECT cursor_value, row_count, last_sync_id FROM sync_state")
        assert state == [(newest, 40, stats.sync_id)]
        runs = wh.fetch("SELECT status, rows_fetched, inserted, pages FROM sync_runs")
        assert runs == [("succeeded", 40, 40, 3)]


def test_incremental_sync_fetches_only_what_changed(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    source = incremental_source(demo_api)
    with connect(warehouse_url) as wh:
        assert run_sync(wh, source).inserted == 40
        demo_api.tracker.mutate(update=2)
        stats = run_sync(wh, source)
        # `since` is inclusive: the newest issue of the previous sync comes again, unchanged.
        assert stats.rows_fetched <= 3
        assert (stats.updated, stats.inserted, stats.deleted) == (2, 0, 0)
        # An incremental API does not show deletions: they wait for a reconciliation sweep.
        demo_api.tracker.mutate(delete=1)
        assert run_sync(wh, source).deleted == 0
        assert wh.fetch("SELECT row_count FROM sync_state") == [(40,)]


def test_failed_walk_stores_nothing(warehouse_url: str, demo_api: DemoAPIServer) -> None:
    with connect(warehouse_url) as wh:
        run_sync(wh, demo_source(demo_api))
        before_rows, before_log = table(wh), changes(wh)
        before_state = wh.fetch("SELECT * FROM sync_state")
        demo_api.tracker.mutate(update=5, create=5)
        # Three pages are needed, two are allowed: the walk fails after fetching page 2.
        with pytest.raises(FetchError):
            run_sync(wh, demo_source(demo_api, page_limit=2))
        assert table(wh).equals(before_rows)
        assert changes(wh).equals(before_log)
        assert wh.fetch("SELECT * FROM sync_state") == before_state
        status, error = wh.fetch(
            "SELECT status, error FROM sync_runs ORDER BY started_at DESC LIMIT 1"
        )[0]
        # A LimitExceeded (a FetchError) naming the setting that stopped the walk.
        assert status == "failed" and "LimitExceeded" in error and "page_limit=2" in error
        # The next good sync picks up exactly the changes the failed one missed.
        stats = run_sync(wh, demo_source(demo_api))
        assert (stats.updated, stats.inserted) == (5, 5)


def test_bad_payload_names_the_record_and_stores_nothing(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    with connect(warehouse_url) as wh:
        run_sync(wh, demo_source(demo_api))
        before = table(wh)
        bad = demo_source(demo_api, columns=COLUMNS | {"title": "bigint"})
        with pytest.raises(PayloadError, match=r"record #0 \(key \{'number': 1\}\)"):
            run_sync(wh, bad)
        assert table(wh).equals(before)


def test_declared_column_added_later(warehouse_url: str, demo_api: DemoAPIServer) -> None:
    with connect(warehouse_url) as wh:
        run_sync(wh, demo_source(demo_api))
        wider = demo_source(demo_api, columns=COLUMNS | {"author": {"path": "user.login"}})
        stats = run_sync(wh, wider)
        assert stats.columns_added == ("author",)
        assert table(wh)["author"].null_count() == 0


def test_concurrent_syncs_of_one_source_do_not_duplicate(demo_api: DemoAPIServer) -> None:
    """Four syncs race on Postgres: the lock serializes their writes, and a sync that fetched
    before another committed is dropped rather than applied over the newer state."""
    import uuid

    url = f"{PG_URL}?schema=cw_race_{uuid.uuid4().hex[:10]}"
    with connect(url) as wh:
        run_sync(wh, demo_source(demo_api))
    demo_api.tracker.mutate(update=6, create=2, delete=1)
    results, errors = [], []

    def sync() -> None:
        try:
            with connect(url) as wh:
                results.append(run_sync(wh, demo_source(demo_api)))
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=sync) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        # The losers skip: they found another sync running, or (had they not waited for its
        # lock) one that committed while they fetched.
        assert results and all(isinstance(e, SyncSkipped) for e in errors)
        assert len(results) + len(errors) == 4
        assert sum(r.changed for r in results) == 9  # exactly one sync saw the changes
        with connect(url) as wh:
            log = changes(wh)
            assert log.filter(pl.col("kind") != "insert").height == 7
            assert log.filter(pl.col("kind") == "insert").height == 42
            assert table(wh)["number"].n_unique() == 41
    finally:
        with connect(url) as wh, wh.transaction():
            wh.execute(f"DROP SCHEMA {url.rsplit('=', 1)[1]} CASCADE")


def test_duckdb_stores_raw_payloads_with_zstd(tmp_path, demo_api: DemoAPIServer) -> None:
    with connect(f"duckdb:///{tmp_path / 'w.duckdb'}") as wh:
        run_sync(wh, demo_source(demo_api))
        wh.execute("CHECKPOINT")
        compression = wh.fetch(
            "SELECT DISTINCT column_name, compression FROM pragma_storage_info('issues') "
            "WHERE column_name IN ('_raw', 'title') AND segment_type <> 'VALIDITY'"
        )
        # Only the raw payload: typed columns keep DuckDB's choice.
        assert ("_raw", "ZSTD") in compression and ("title", "ZSTD") not in compression
        payload = wh.fetch("SELECT _raw->>'title' FROM issues WHERE number = 1")
        assert payload == [(demo_api.tracker.get(1)["title"],)]


def test_postgres_first_sync_builds_primary_keys_after_the_load(demo_api: DemoAPIServer) -> None:
    """Into empty tables the primary keys are built once after the COPY (the same keys as
    before, enforced); a sync into filled tables leaves them alone."""
    import uuid

    from changewatch.warehouse.schema import ensure_bookkeeping, ensure_source_tables

    schema = f"cw_pk_{uuid.uuid4().hex[:10]}"
    source = demo_source(demo_api)

    def keys(wh: Any) -> list[tuple[Any, ...]]:
        return wh.fetch(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), conindid "
            "FROM pg_constraint WHERE contype = 'p' AND connamespace = $1::regnamespace "
            "ORDER BY 1",
            (schema,),
        )

    try:
        with connect(f"{PG_URL}?schema={schema}") as wh:
            with wh.transaction():
                ensure_bookkeeping(wh)
                ensure_source_tables(wh, source.config)
            created = {k[0]: k for k in keys(wh)}
            run_sync(wh, source)
            first = {k[0]: k for k in keys(wh)}
            for name in ("issues", "issues_changes"):
                # Same name and definition, a new index: built after the rows went in.
                assert first[name][1:3] == created[name][1:3]
                assert first[name][3] != created[name][3]
            assert first["issues"][2] == "PRIMARY KEY (number)"
            with pytest.raises(Exception, match="duplicate key"), wh.transaction():
                wh.execute("INSERT INTO issues SELECT * FROM issues WHERE number = 1")
            demo_api.tracker.mutate(update=2, create=1)
            assert run_sync(wh, source).changed == 3
            assert {k[0]: k for k in keys(wh)} == first
    finally:
        with connect(PG_URL) as wh, wh.transaction():
            wh.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
