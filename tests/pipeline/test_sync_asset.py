"""The demo sync asset, materialized by Dagster into a real warehouse from the real demo API.

Each run goes through a persistent (SQLite) Dagster instance with the warehouse pool limited to
one slot, with definitions built from the bundled watches.yaml and the warehouse URL taken from
the environment, exactly as the code location does.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import pytest
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources.normalize import HASH_COLUMN
from changewatch.warehouse import connect

FAKE_PASSWORD = "pw-never-in-metadata-7Qx"


def with_password(url: str) -> tuple[str, str | None]:
    """The URL with a password, and that password (None for DuckDB, which has none).

    The test server trusts local connections, so an invented password still connects; a URL
    that already carries a password keeps it.
    """
    parts = urlsplit(url)
    if not parts.scheme.startswith("postgres"):
        return url, None
    if parts.password is not None:
        return url, parts.password
    assert parts.username, f"the test PostgreSQL URL needs a user name: {url}"
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{parts.username}:{FAKE_PASSWORD}@{parts.hostname}{port}"
    return urlunsplit(parts._replace(netloc=netloc)), FAKE_PASSWORD


@pytest.fixture
def wh_url(warehouse_url: str, demo_env, monkeypatch: pytest.MonkeyPatch) -> str:
    url, _ = with_password(warehouse_url)
    monkeypatch.setenv(WAREHOUSE_URL_ENV, url)
    return url


@pytest.fixture
def instance():
    with dg.instance_for_test(overrides={"concurrency": {"pools": {"default_limit": 1}}}) as inst:
        yield inst


def materialize(instance: dg.DagsterInstance, **kwargs: Any) -> dg.ExecuteInProcessResult:
    """The sync asset alone, out of the whole graph (the evaluation, delivery and digest
    assets downstream of it are tested with the demo and the sensor daemon)."""
    config = load_config()  # reads CHANGEWATCH_CONFIG and the environment
    defs = build_definitions(config)
    return dg.materialize(
        list(defs.assets),  # type: ignore[arg-type]
        selection=[config.source("demo_issues").table],
        instance=instance,
        resources=defs.resources,
        tags={SOURCE_TAG: "demo_issues"},
        **kwargs,
    )


def metadata(result: dg.ExecuteInProcessResult, table: str) -> dict[str, Any]:
    [event] = result.asset_materializations_for_node(table)
    return {key: value.value for key, value in event.metadata.items()}


def table_state(url: str, table: str, key: str) -> list[tuple]:
    with connect(url) as wh:
        return wh.fetch(f'SELECT "{key}", "{HASH_COLUMN}" FROM "{table}" ORDER BY 1')


def change_log(url: str, table: str, key: str, sync_id: str) -> dict[str, list[int]]:
    with connect(url) as wh:
        rows = wh.fetch(
            f'SELECT kind, coalesce("new_{key}", "old_{key}") FROM "{table}_changes" '
            "WHERE sync_id = $1 ORDER BY 2",
            (sync_id,),
        )
    kinds: dict[str, list[int]] = {}
    for kind, number in rows:
        kinds.setdefault(kind, []).append(number)
    return kinds


def sync_run(url: str, dagster_run_id: str) -> tuple:
    with connect(url) as wh:
        [row] = wh.fetch(
            "SELECT status, error, source FROM sync_runs WHERE dagster_run_id = $1",
            (dagster_run_id,),
        )
    return row


def test_sync_asset_inserts_then_sees_nothing_then_exactly_the_changes(wh_url, demo_api, instance):
    config = load_config()
    source = config.source("demo_issues")
    key = source.primary_key[0]
    issues = len(demo_api.tracker)

    # -- first sync: every issue is new ---------------------------------------------------------
    demo_api.reset_stats()
    first = materialize(instance)
    assert first.success
    assert {e.asset_key for e in first.get_asset_materialization_events()} == {
        dg.AssetKey(source.table)
    }
    meta = metadata(first, source.table)
    assert meta["rows_fetched"] == issues == 40
    assert (meta["inserted"], meta["updated"], meta["deleted"]) == (issues, 0, 0)
    assert meta["changed"] == issues
    assert meta["unchanged"] == 0
    assert meta["row_count"] == issues
    assert meta["pages"] == math.ceil(issues / int(source.params["per_page"]))
    assert meta["http_requests"] == demo_api.stats()["requests"] >= meta["pages"]
    assert isinstance(meta["duration_s"], float) and meta["duration_s"] > 0
    assert meta["cursor"] == max(i["updated_at"] for i in demo_api.tracker.snapshot())
    assert meta["sync_id"].startswith("demo_issues-")
    assert [n for n, _ in table_state(wh_url, source.table, key)] == sorted(
        i["number"] for i in demo_api.tracker.snapshot()
    )
    assert sync_run(wh_url, first.run_id) == ("succeeded", None, "demo_issues")

    # The materialization is recorded in the instance, for the asset and for the run.
    stored = instance.get_latest_materialization_event(dg.AssetKey(source.table))
    assert stored is not None and stored.run_id == first.run_id
    assert stored.asset_materialization.metadata["inserted"].value == issues
    run = instance.get_run_by_id(first.run_id)
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert run.tags[SOURCE_TAG] == "demo_issues"

    # -- second sync: nothing changed upstream -----------------------------------------------------
    before = table_state(wh_url, source.table, key)
    second = materialize(instance)
    meta = metadata(second, source.table)
    assert meta["rows_fetched"] == issues
    assert (meta["inserted"], meta["updated"], meta["deleted"], meta["changed"]) == (0, 0, 0, 0)
    assert meta["unchanged"] == issues
    assert table_state(wh_url, source.table, key) == before
    assert change_log(wh_url, source.table, key, meta["sync_id"]) == {}

    # -- third sync: exactly what the tracker changed ----------------------------------------------
    mutation = demo_api.tracker.mutate(update=3, delete=2, create=1)
    third = materialize(instance)
    meta = metadata(third, source.table)
    assert (meta["inserted"], meta["updated"], meta["deleted"]) == (1, 3, 2)
    assert meta["changed"] == 6
    assert meta["rows_fetched"] == meta["row_count"] == len(demo_api.tracker) == issues - 1
    assert meta["unchanged"] == issues - 1 - 1 - 3
    assert change_log(wh_url, source.table, key, meta["sync_id"]) == {
        "insert": mutation["created"],
        "update": mutation["updated"],
        "delete": mutation["deleted"],
    }
    latest = instance.get_latest_materialization_event(dg.AssetKey(source.table))
    assert latest is not None and latest.run_id == third.run_id
    assert len(instance.get_runs()) == 3


def test_warehouse_password_stays_out_of_metadata_and_instance(wh_url, warehouse_url, instance):
    _, password = with_password(warehouse_url)
    result = materialize(instance)
    assert result.success  # connected with the URL as given, password and all
    meta = metadata(result, load_config().source("demo_issues").table)
    if password is None:
        assert meta["warehouse"] == wh_url  # DuckDB: the URL has nothing to hide
        return
    assert password in os.environ[WAREHOUSE_URL_ENV]
    parts = urlsplit(wh_url)
    assert meta["warehouse"] == wh_url.replace(
        f"{parts.username}:{password}@", f"{parts.username}@"
    )
    assert password not in meta["warehouse"]
    # Nowhere in what Dagster keeps: events, run record, run config, or any file it wrote.
    assert password not in repr(instance.all_logs(result.run_id))
    assert password not in repr(instance.get_run_by_id(result.run_id))
    for path in Path(instance.root_directory).rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path


def test_failing_source_fails_the_run_and_leaves_the_table_untouched(
    wh_url, demo_api, instance, monkeypatch
):
    config = load_config()
    source = config.source("demo_issues")
    key = source.primary_key[0]
    good = materialize(instance)
    assert good.success
    before = table_state(wh_url, source.table, key)
    with connect(wh_url) as wh:
        changes_before = wh.fetch(f'SELECT count(*) FROM "{source.table}_changes"')
        state_before = wh.fetch("SELECT * FROM sync_state")

    # The tracker changes, but the sync cannot reach it: the base URL now answers 404, which
    # fails at once (a closed port would be retried with backoff for several seconds).
    demo_api.tracker.mutate(update=2, delete=1, create=1)
    monkeypatch.setenv("CHANGEWATCH_DEMO_URL", f"{demo_api.url}/gone")
    failed = materialize(instance, raise_on_error=False)

    assert failed.success is False
    [failure] = [e for e in failed.all_events if e.is_step_failure]
    assert "404" in str(failure.step_failure_data.error)
    assert failed.asset_materializations_for_node(source.table) == []
    assert instance.get_run_by_id(failed.run_id).status == dg.DagsterRunStatus.FAILURE
    latest = instance.get_latest_materialization_event(dg.AssetKey(source.table))
    assert latest is not None and latest.run_id == good.run_id

    status, error, name = sync_run(wh_url, failed.run_id)
    assert (status, name) == ("failed", "demo_issues")
    assert "404" in error
    assert table_state(wh_url, source.table, key) == before
    with connect(wh_url) as wh:
        assert wh.fetch(f'SELECT count(*) FROM "{source.table}_changes"') == changes_before
        assert wh.fetch("SELECT * FROM sync_state") == state_before
