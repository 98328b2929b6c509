"""stop.after_notifications and a watch's stop.until, through real runs on both backends.

A source on the demo API with two watches writing to a file channel; the sync job runs in
process against a persistent Dagster instance (so `changewatch resume` finds the same one),
the delivery step pauses what has been notified enough, and a stopped watch evaluates
nothing until resumed, when it catches up on the changes that waited.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.cli.command_line import main
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.polling.source_pauses import NOT_PAUSED_CHECK, paused_reasons
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.pipeline.triggers.sync_sensors import SYNC_JOB
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from cw_testing import demo_source_settings

COLUMNS = {"number": "bigint", "comments": "integer", "updated_at": "timestamp"}


def write_config(folder: Path, base_url: str, **watch_stop: Any) -> Path:
    source = demo_source_settings(
        base_url,
        COLUMNS,
        name="alpha",
        table="alpha",
        baseline="silent",
        stop={"after_notifications": 3},
    )
    config = {
        "version": 1,
        "sources": [source],
        "channels": [{"name": "out", "type": "file", "path": "notifications.jsonl"}],
        "watches": [
            {
                "name": "updates",
                "source": "alpha",
                "where": "kind = 'update'",
                "channels": ["out"],
                "stop": {"after_notifications": 2, **watch_stop},
            },
            {"name": "news", "source": "alpha", "where": "kind = 'insert'", "channels": ["out"]},
        ],
    }
    path = folder / "watches.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text("", encoding="utf-8")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as inst:
        yield inst


def sync(defs: dg.Definitions, instance: dg.DagsterInstance) -> None:
    job = defs.resolve_job_def(SYNC_JOB)
    assert job.execute_in_process(instance=instance, tags={SOURCE_TAG: "alpha"}).success


def notified(folder: Path) -> list[str]:
    path = folder / "notifications.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["watch"] for line in path.read_text().splitlines()]


def check(instance: dg.DagsterInstance, asset: str) -> Any:
    key = dg.AssetCheckKey(dg.AssetKey(asset), NOT_PAUSED_CHECK)
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    return record.event.dagster_event.event_specific_data


def test_after_notifications_pauses_the_watch_then_the_source_until_resumed(
    tmp_path, instance, demo_api: DemoAPIServer, warehouse_url, monkeypatch, capsys
):
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    config = write_config(tmp_path, demo_api.url)
    defs = build_definitions(load_config(config))
    sync(defs, instance)  # the silent baseline: nothing notified
    assert notified(tmp_path) == []
    assert check(instance, "eval_updates").passed and check(instance, "alpha").passed

    # Two updates: the watch's second notification reaches its limit; the source has 2 of 3.
    demo_api.tracker.mutate(update=2)
    sync(defs, instance)
    assert notified(tmp_path) == ["updates", "updates"]
    reason = "2 notifications delivered (stop.after_notifications: 2)"
    assert paused_reasons(instance, "watch", ["updates"]) == {"updates": reason}
    assert not check(instance, "eval_updates").passed
    assert paused_reasons(instance, "source", ["alpha"]) == {}

    # The stopped watch evaluates nothing (its update waits); the other one notifies the new
    # issue, the source's third notification: the source is paused and poll_schedule says so.
    demo_api.tracker.mutate(update=1, create=1)
    sync(defs, instance)
    assert notified(tmp_path) == ["updates", "updates", "news"]
    stopped = check(instance, "eval_updates")  # now as the run reported it
    assert not stopped.passed and reason in stopped.description
    source_reason = "3 notifications delivered (stop.after_notifications: 3)"
    assert paused_reasons(instance, "source", ["alpha"]) == {"alpha": source_reason}
    assert not check(instance, "alpha").passed
    with connect(warehouse_url) as wh:
        rows = wh.fetch("SELECT source, paused, reason, next_due FROM poll_schedule")
    assert rows == [("alpha", True, source_reason, None)]

    # Resumed, the watch catches up on the update that waited, and counts afresh from now:
    # one notification is below its limit, so it goes on.
    capsys.readouterr()
    assert main(["--config", str(config), "resume", "updates"]) == 0
    assert capsys.readouterr().out.startswith("watch updates: resumed (paused since ")
    sync(defs, instance)  # by hand: a paused source still syncs when asked to
    assert notified(tmp_path) == ["updates", "updates", "news", "updates"]
    assert paused_reasons(instance, "watch", ["updates"]) == {}
    assert check(instance, "eval_updates").passed
    # The source stays paused (its check says so after this run too) until resumed itself.
    assert not check(instance, "alpha").passed


def test_a_watch_past_its_until_evaluates_nothing(
    tmp_path, instance, demo_api: DemoAPIServer, warehouse_url, monkeypatch
):
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    config = write_config(tmp_path, demo_api.url, until="2020-01-01")
    defs = build_definitions(load_config(config))
    sync(defs, instance)
    demo_api.tracker.mutate(update=1, create=1)
    sync(defs, instance)
    assert notified(tmp_path) == ["news"]
    evaluation = check(instance, "eval_updates")
    assert not evaluation.passed
    assert "stop.until 2020-01-02T00:00:00+00:00 has passed" in evaluation.description
