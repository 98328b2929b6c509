"""Quiet baselines, silent backfills, the change-storm guard and reconciliation sweeps."""

from __future__ import annotations

from typing import Any

import polars as pl
from changewatch.evaluators.config import Watch
from changewatch.evaluators.evaluate import evaluate_watch
from changewatch.evaluators.filters import compile_filter
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import held_changes, release_changes, run_sync
from cw_testing import demo_source_settings

COLUMNS: dict[str, Any] = {
    "number": "bigint",
    "title": "text",
    "comments": "integer",
    "updated_at": "timestamp",
}
WATCH = Watch(name="everything", sources=["demo_issues"], where="TRUE")


def source(api: DemoAPIServer, **overrides: Any) -> RestSourceConfig:
    return RestSourceConfig.model_validate(demo_source_settings(api.url, COLUMNS, **overrides))


def sync(url: str, config: RestSourceConfig, **options: Any):
    with connect(url) as wh:
        return run_sync(wh, RestSource(config), **options)


def evaluate(url: str, config: RestSourceConfig):
    compiled = compile_filter(WATCH.where, watch=WATCH.name, columns={c: "text" for c in COLUMNS})
    with connect(url) as wh:
        return evaluate_watch(wh, WATCH, {config.name: config}, {config.name: compiled})


def test_first_sync_is_a_silent_baseline_by_default(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    config = source(demo_api, baseline="silent")
    first = sync(warehouse_url, config)
    assert first.silent and first.inserted == 40
    # The baseline is in the change log, yet no watch is told about it.
    assert evaluate(warehouse_url, config).changes_read == 0
    demo_api.tracker.mutate(update=2, create=1)
    assert not sync(warehouse_url, config).silent
    later = evaluate(warehouse_url, config)
    assert (later.changes_read, later.notified) == (3, 3)


def test_a_backfill_can_be_silent(warehouse_url: str, demo_api: DemoAPIServer) -> None:
    config = source(demo_api)  # baseline: evaluate
    sync(warehouse_url, config)
    evaluate(warehouse_url, config)
    demo_api.tracker.mutate(update=4)
    assert sync(warehouse_url, config, silent=True).silent
    assert evaluate(warehouse_url, config).changes_read == 0


def test_change_storm_is_held_until_released(warehouse_url: str) -> None:
    with DemoAPIServer(DemoTracker(issues=200, seed=5)) as api:
        config = source(api, storm={"max_share": 0.25, "min_rows": 100})
        sync(warehouse_url, config)
        evaluate(warehouse_url, config)
        api.tracker.mutate(update=20)  # 10%: news
        calm = sync(warehouse_url, config)
        assert not calm.storm_held
        assert evaluate(warehouse_url, config).changes_read == 20
        api.tracker.mutate(update=80)  # 40%: a storm
        storm = sync(warehouse_url, config)
        assert storm.storm_held and storm.updated == 80
        with connect(warehouse_url) as wh:
            assert held_changes(wh, config) == 80
        assert evaluate(warehouse_url, config).changes_read == 0
        # Later calm syncs go through while the storm waits.
        api.tracker.mutate(update=5)
        sync(warehouse_url, config)
        assert evaluate(warehouse_url, config).changes_read == 5
        with connect(warehouse_url) as wh:
            assert release_changes(wh, config) == 80
            assert held_changes(wh, config) == 0
        released = evaluate(warehouse_url, config)
        assert (released.changes_read, released.notified) == (80, 80)
        assert evaluate(warehouse_url, config).changes_read == 0


def test_discarded_storm_is_never_evaluated(warehouse_url: str) -> None:
    with DemoAPIServer(DemoTracker(issues=120, seed=9)) as api:
        config = source(api, storm={"max_share": 0.5, "min_rows": 100})
        sync(warehouse_url, config)
        assert evaluate(warehouse_url, config).changes_read == 120
        api.tracker.mutate(update=100)
        assert sync(warehouse_url, config).storm_held
        with connect(warehouse_url) as wh:
            assert release_changes(wh, config, discard=True) == 100
        assert evaluate(warehouse_url, config).changes_read == 0


def test_sweep_turns_vanished_objects_into_deletes(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    config = source(
        demo_api,
        sync="incremental",
        incremental={"param": "since"},
        params={"state": "all", "per_page": 100, "sort": "updated", "direction": "asc"},
    )
    sync(warehouse_url, config)
    evaluate(warehouse_url, config)
    gone = demo_api.tracker.mutate(delete=2)["deleted"]
    assert sync(warehouse_url, config).deleted == 0  # an incremental walk cannot see it
    sweep = sync(warehouse_url, config, full=True)
    assert (sweep.deleted, sweep.updated, sweep.inserted) == (2, 0, 0)
    assert sync(warehouse_url, config, full=True).deleted == 0  # exactly once
    evaluation = evaluate(warehouse_url, config)
    assert evaluation.changes_read == 2
    with connect(warehouse_url) as wh:
        deletes = wh.fetch_frame("SELECT object_key FROM issues_changes WHERE kind = 'delete'")
    assert sorted(deletes["object_key"].cast(int)) == sorted(gone)
    assert deletes.filter(pl.col("object_key").is_duplicated()).height == 0


def test_a_watch_added_later_starts_at_the_latest_sync(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    config = source(demo_api)  # baseline: evaluate
    sync(warehouse_url, config)
    demo_api.tracker.mutate(update=5)
    sync(warehouse_url, config)
    demo_api.tracker.mutate(update=2)
    sync(warehouse_url, config)
    # The watch first runs now: the 40 inserts and 5 updates of earlier syncs are history.
    first = evaluate(warehouse_url, config)
    assert (first.changes_read, first.notified) == (2, 2)
    assert evaluate(warehouse_url, config).changes_read == 0
