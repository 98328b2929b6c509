"""Records that repeat a key within one sync: counted in sync_runs and the asset's metadata,
one row kept per key (the newest by updated-at, else the last in walk order)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from apiserver import ApiServer, Reply
from changewatch.pipeline.assets.sync_assets import sync_asset
from changewatch.pipeline.project.warehouse_resource import WarehouseResource
from changewatch.sources.rest import RestSourceConfig, build_rest_source
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


def settings(api: ApiServer, **extra: Any) -> dict[str, Any]:
    return {
        "name": "acme_items",
        "type": "rest",
        "table": "items",
        "primary_key": "id",
        "columns": {"id": "bigint", "title": "text", "updated_at": "timestamp"},
        "base_url": api.base_url,
        "path": "items",
        "paginator": {"type": "page_number"},
        **extra,
    }


def serve_pages(api: ApiServer, *pages: list[dict[str, Any]]) -> None:
    for page in (*pages, []):  # an empty page ends the walk
        api.queue("/items", Reply.json(page))


def titles(wh: Any) -> dict[int, str]:
    return dict(wh.fetch("SELECT id, title FROM items ORDER BY id"))


def test_without_updated_at_the_last_record_in_walk_order_wins_and_is_counted(
    warehouse_url: str, api: ApiServer
) -> None:
    serve_pages(
        api,
        [{"id": 1, "title": "first"}, {"id": 2, "title": "two"}],
        [{"id": 1, "title": "second"}, {"id": 3, "title": "three"}, {"id": 1, "title": "third"}],
    )
    with connect(warehouse_url) as wh:
        stats = run_sync(wh, build_rest_source(settings(api)))
        assert (stats.rows_duplicate, stats.inserted) == (2, 3)
        assert titles(wh) == {1: "third", 2: "two", 3: "three"}
        assert wh.fetch(
            "SELECT rows_duplicate FROM sync_runs WHERE sync_id = $1", (stats.sync_id,)
        ) == [(2,)]
        # A sync without repeats records zero, not nothing.
        serve_pages(api, [{"id": 1, "title": "third"}, {"id": 2, "title": "two"}])
        again = run_sync(wh, build_rest_source(settings(api)))
        assert again.rows_duplicate == 0
        assert wh.fetch(
            "SELECT rows_duplicate FROM sync_runs WHERE sync_id = $1", (again.sync_id,)
        ) == [(0,)]


def test_with_updated_at_the_newest_record_wins_wherever_it_came(
    warehouse_url: str, api: ApiServer
) -> None:
    serve_pages(
        api,
        [{"id": 1, "title": "new", "updated_at": "2026-03-02T00:00:00Z"}],
        [
            {"id": 1, "title": "old", "updated_at": "2026-03-01T00:00:00Z"},
            {"id": 1, "title": "undated"},
        ],
    )
    with connect(warehouse_url) as wh:
        stats = run_sync(wh, build_rest_source(settings(api, updated_at="updated_at")))
        assert stats.rows_duplicate == 2
        assert titles(wh) == {1: "new"}


def test_an_older_sync_runs_table_gains_the_column(warehouse_url: str, api: ApiServer) -> None:
    # sync_runs as releases before the duplicate count created it.
    with connect(warehouse_url) as wh, wh.transaction():
        wh.execute(
            "CREATE TABLE sync_runs (sync_id TEXT PRIMARY KEY, source TEXT NOT NULL, "
            "dagster_run_id TEXT, started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ, "
            "status TEXT NOT NULL, pages INTEGER, requests INTEGER, rows_fetched BIGINT, "
            "inserted BIGINT, updated BIGINT, deleted BIGINT, unchanged BIGINT, "
            "cursor_before TEXT, cursor_after TEXT, silent BOOLEAN, storm_held BOOLEAN, "
            "not_modified BOOLEAN, error TEXT)"
        )
        wh.execute(
            "INSERT INTO sync_runs (sync_id, source, started_at, status) "
            "VALUES ('old-run', 'acme_items', TIMESTAMPTZ '2026-01-01 00:00:00+00', 'succeeded')"
        )
    serve_pages(api, [{"id": 1, "title": "a"}, {"id": 1, "title": "b"}])
    with connect(warehouse_url) as wh:
        stats = run_sync(wh, build_rest_source(settings(api)))
        rows = wh.fetch("SELECT sync_id, rows_duplicate FROM sync_runs ORDER BY started_at")
    assert rows == [("old-run", None), (stats.sync_id, 1)]


def test_the_sync_asset_reports_the_repeats_in_its_metadata(
    warehouse_url: str, api: ApiServer
) -> None:
    serve_pages(api, [{"id": 5, "title": "a"}, {"id": 5, "title": "b"}, {"id": 6, "title": "c"}])
    config = RestSourceConfig.model_validate(settings(api))
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [sync_asset(config, warehouse_url=warehouse_url)],
            instance=instance,
            resources={"warehouse": WarehouseResource(url=warehouse_url)},
        )
    assert result.success
    [event] = result.asset_materializations_for_node("items")
    meta = {key: value.value for key, value in event.metadata.items()}
    assert (meta["rows_duplicate"], meta["inserted"]) == (1, 2)
