"""From a signed webhook to a notification: the receiver on loopback stores deliveries, the
webhook sensor (evaluated against a real Dagster instance) requests a sync, the run syncs the
demo API into a real warehouse on both backends and consumes the deliveries; a poll after it
finds the same change and makes neither a second change nor a second notification.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
import yaml
from changewatch.pipeline.assets.batched_syncs import BATCH_JOB, batch_run_config, batch_sources
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.polling.poll_slots import due_slot
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import ConfigError, load_config
from changewatch.pipeline.triggers.sync_sensors import SYNC_JOB, SYNC_SENSOR, TRIGGER_TAG
from changewatch.pipeline.triggers.webhook_sensor import DELIVERIES_TAG, WEBHOOK_SENSOR
from changewatch.pipeline.webhooks.webhook_inbox import INBOX_ENV, Inbox
from changewatch.pipeline.webhooks.webhook_receiver import WebhookReceiver
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from cw_testing import demo_source_settings

SECRET = "webhook-test-s3cret"
SECRET_ENV = "CW_TEST_WEBHOOK_SECRET"
COLUMNS = {"number": "bigint", "comments": "integer", "updated_at": "timestamp"}


def write_config(folder: Path, base_url: str, **settings: Any) -> Path:
    source = demo_source_settings(
        base_url,
        COLUMNS,
        **settings,
        name="alpha",
        table="alpha",
        baseline="silent",
        webhook={"path": "/hooks/alpha", "secret_env": SECRET_ENV, "provider": "github"},
    )
    config = {
        "version": 1,
        "sources": [source],
        "channels": [{"name": "out", "type": "file", "path": "notifications.jsonl"}],
        "watches": [
            {"name": "updates", "source": "alpha", "where": "kind = 'update'", "channels": ["out"]}
        ],
    }
    path = folder / "watches.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def setup(
    tmp_path: Path, demo_api: DemoAPIServer, warehouse_url: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    monkeypatch.setenv(INBOX_ENV, str(tmp_path / "inbox.sqlite"))
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    config = load_config(write_config(tmp_path, demo_api.url))
    return {"config": config, "defs": build_definitions(config), "folder": tmp_path}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def post(url: str, delivery: str, number: int) -> httpx.Response:
    body = json.dumps({"action": "edited", "issue": {"number": number}}).encode()
    mac = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "X-Hub-Signature-256": f"sha256={mac}",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "issues",
    }
    return httpx.post(f"{url}/hooks/alpha", content=body, headers=headers)


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None = None):
    sensor = defs.resolve_sensor_def(WEBHOOK_SENSOR)
    context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    return sensor.evaluate_tick(context)


def run(defs: dg.Definitions, instance: dg.DagsterInstance, tags: dict[str, str]):
    result = defs.resolve_job_def(SYNC_JOB).execute_in_process(instance=instance, tags=tags)
    assert result.success
    return result


def inbox_rows(folder: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(folder / "inbox.sqlite") as con:
        return con.execute(
            "SELECT delivery_id, consumed_by FROM webhook_inbox ORDER BY seq"
        ).fetchall()


def changes_of(url: str, number: int) -> list[tuple[str, int]]:
    with connect(url) as wh:
        return wh.fetch(
            "SELECT kind, new_comments FROM alpha_changes WHERE object_key = $1 ORDER BY change_id",
            (str(number),),
        )


def notified(folder: Path) -> list[dict]:
    path = folder / "notifications.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_webhook_syncs_once_and_the_next_poll_adds_nothing(
    setup, instance, demo_api: DemoAPIServer, warehouse_url: str
) -> None:
    defs, folder = setup["defs"], setup["folder"]
    run(defs, instance, {SOURCE_TAG: "alpha"})  # the first poll: a silent baseline
    assert tick(defs, instance).run_requests == []  # nothing delivered yet

    [number] = demo_api.tracker.mutate(update=1)["updated"]
    with WebhookReceiver(
        setup["config"].sources, inbox=Inbox(folder / "inbox.sqlite"), port=0
    ) as r:
        assert post(r.url, "d-1", number).status_code == 202
        assert post(r.url, "d-1", number).status_code == 200  # GitHub's redelivery
        assert post(r.url, "d-2", number).status_code == 202  # a second event, same issue

    first = tick(defs, instance)
    [request] = first.run_requests
    assert request.job_name == SYNC_JOB
    assert dg.AssetKey("alpha") in (request.asset_selection or [])
    assert request.tags[TRIGGER_TAG] == "webhook" and request.tags[DELIVERIES_TAG] == "2"
    assert request.run_key.startswith("alpha:webhook:")
    # From the cursor: requested already. Without it (a lost cursor): the same key, which
    # Dagster runs once.
    assert tick(defs, instance, first.cursor).run_requests == []
    assert [r.run_key for r in tick(defs, instance).run_requests] == [request.run_key]

    done = run(defs, instance, request.tags)
    [sync] = [
        m for m in done.asset_materializations_for_node("alpha") if m.asset_key.path == ["alpha"]
    ]
    assert sync.metadata["webhook_deliveries"].value == 2
    assert inbox_rows(folder) == [("d-1", done.run_id), ("d-2", done.run_id)]
    comments = demo_api.tracker.get(number)["comments"]
    assert changes_of(warehouse_url, number) == [("insert", comments - 1), ("update", comments)]
    assert [n["object_key"] for n in notified(folder)] == [str(number)]
    assert tick(defs, instance).run_requests == []  # consumed: nothing pending

    # The reconciliation poll sees the same issue, unchanged since: no change, no notification.
    run(defs, instance, {SOURCE_TAG: "alpha", TRIGGER_TAG: "interval"})
    assert changes_of(warehouse_url, number) == [("insert", comments - 1), ("update", comments)]
    assert len(notified(folder)) == 1


def test_a_failed_sync_leaves_its_deliveries_pending(
    setup, instance, demo_api: DemoAPIServer
) -> None:
    folder = setup["folder"]
    # A path the API does not serve: the sync fails at once (a 404 is not retried).
    defs = build_definitions(load_config(write_config(folder, demo_api.url, path="/gone")))
    inbox = Inbox(folder / "inbox.sqlite")
    inbox.put("alpha", "d-9", provider="github", event="issues", body=b"{}")
    [request] = tick(defs, instance).run_requests
    result = defs.resolve_job_def(SYNC_JOB).execute_in_process(
        instance=instance, tags=request.tags, raise_on_error=False
    )
    assert not result.success
    failed = {e.step_key for e in result.all_events if e.event_type_value == "STEP_FAILURE"}
    assert failed == {"alpha"}
    assert inbox_rows(folder) == [("d-9", None)]
    assert [p.delivery_id for p in inbox.pending()] == ["d-9"]


def test_a_delivery_stored_after_a_sync_began_stays_pending(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.sqlite")
    inbox.put("alpha", "early", provider="standard", event=None, body=b"{}")
    covered = inbox.watermark("alpha")  # the sync begins fetching here
    inbox.put("alpha", "late", provider="standard", event=None, body=b"{}")
    inbox.put("beta", "other", provider="standard", event=None, body=b"{}")
    assert inbox.consume("alpha", covered, by="run-1") == 1
    assert [(p.source, p.delivery_id) for p in inbox.pending()] == [
        ("alpha", "late"),
        ("beta", "other"),
    ]
    # Consumed deliveries are kept a while (a late retry is still a duplicate), then pruned.
    assert not inbox.put("alpha", "early", provider="standard", event=None, body=b"{}")
    inbox.consume("beta", inbox.watermark("beta"), by="run-2", now=time.time() + 31 * 86400)
    assert inbox.put("alpha", "early", provider="standard", event=None, body=b"{}")


def test_a_webhook_source_is_polled_hourly_without_probes(
    tmp_path: Path, demo_api: DemoAPIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    defs = build_definitions(load_config(write_config(tmp_path, demo_api.url)), environ={})
    with dg.instance_for_test() as instance:
        sensor = defs.resolve_sensor_def(SYNC_SENSOR)
        now = time.time()
        result = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
    [request] = result.run_requests
    assert request.tags[TRIGGER_TAG] == "interval"
    assert request.run_key in {f"alpha:{due_slot(t, 3600.0)}" for t in (now, time.time())}
    assert demo_api.stats()["requests"] == 0  # no probe: the webhooks say what changed
    freshness = defs.resolve_assets_def("alpha").specs_by_key[dg.AssetKey("alpha")]
    assert freshness.freshness_policy.warn_window.to_timedelta().total_seconds() == 2 * 3600


def test_the_daemon_ticks_the_webhook_sensor_at_each_of_its_passes(tmp_path: Path) -> None:
    # Dagster's sensor daemon evaluates sensors every MIN_INTERVAL_LOOP_TIME seconds (5) and
    # skips one whose minimum interval has not passed since its last tick: at a minimum of 5,
    # a pass a few ms early was skipped and deliveries waited 10 s (bench/bench_webhooks.py).
    from dagster._daemon.sensor import MIN_INTERVAL_LOOP_TIME

    defs = build_definitions(load_config(write_config(tmp_path, "http://127.0.0.1:9")))
    sensor = defs.resolve_sensor_def(WEBHOOK_SENSOR)
    assert sensor.minimum_interval_seconds < MIN_INTERVAL_LOOP_TIME


def test_webhook_settings_are_checked_when_the_file_loads(tmp_path: Path) -> None:
    hook = {"path": "/hooks/same", "secret_env": SECRET_ENV}
    sources = [
        demo_source_settings("http://127.0.0.1:9", COLUMNS, name=n, table=n, webhook=hook)
        for n in ("one", "two")
    ]
    sources.append(
        demo_source_settings(
            "http://127.0.0.1:9", COLUMNS, name="three", table="three", webhook={"path": "x"}
        )
    )
    path = tmp_path / "watches.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "sources": sources}), encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    lines = str(error.value).splitlines()
    assert any(
        "sources[2].webhook.path: " in line and "'x' is not a webhook path" in line
        for line in lines
    ), lines
    assert any("sources[2].webhook.secret_env: " in line for line in lines), lines
    del sources[2]
    path.write_text(yaml.safe_dump({"version": 1, "sources": sources}), encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value).endswith(
        "sources[1].webhook.path: source 'one' receives at /hooks/same already"
    )


def test_a_replaced_inbox_file_is_read_from_its_start(
    tmp_path: Path, demo_api: DemoAPIServer, monkeypatch: pytest.MonkeyPatch, instance
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setenv(INBOX_ENV, str(tmp_path / "inbox.sqlite"))
    defs = build_definitions(load_config(write_config(tmp_path, demo_api.url)), environ={})
    inbox = Inbox(tmp_path / "inbox.sqlite")
    for delivery in ("a", "b", "c"):
        inbox.put("alpha", delivery, provider="github", event="issues", body=b"{}")
    first = tick(defs, instance)
    assert first.cursor == "3" and len(first.run_requests) == 1
    # Someone deletes the file; the next delivery is seq 1 of a new one.
    for path in tmp_path.glob("inbox.sqlite*"):
        path.unlink()
    inbox.put("alpha", "d", provider="github", event="issues", body=b"{}")
    [request] = tick(defs, instance, first.cursor).run_requests
    assert request.tags[DELIVERIES_TAG] == "1" and request.run_key != first.run_requests[0].run_key


def test_deliveries_join_a_queued_webhook_run_of_their_source(
    setup, instance, demo_api: DemoAPIServer, warehouse_url: str
) -> None:
    defs, folder = setup["defs"], setup["folder"]
    run(defs, instance, {SOURCE_TAG: "alpha"})  # the silent baseline
    inbox = Inbox(folder / "inbox.sqlite")
    [first_issue, second_issue] = demo_api.tracker.mutate(update=2)["updated"]
    inbox.put("alpha", "d-1", provider="github", event="issues", body=b"{}")
    first = tick(defs, instance)
    [request] = first.run_requests
    # That run is made and waits for a worker (the daemon's queue makes it QUEUED, which needs
    # a code location's origin; bench/bench_hosts_webhooks.py sees that one on real hosts).
    job = defs.resolve_job_def(SYNC_JOB)
    queued = instance.create_run_for_job(
        job, status=dg.DagsterRunStatus.NOT_STARTED, tags=request.tags
    )
    inbox.put("alpha", "d-2", provider="github", event="issues", body=b"{}")
    joined = tick(defs, instance, first.cursor)
    assert joined.run_requests == []  # no second run queued behind the first
    assert joined.cursor == "2"

    # The queued run begins: its sync covers both deliveries and both changes.
    instance.delete_run(queued.run_id)
    done = run(defs, instance, request.tags)
    assert inbox_rows(folder) == [("d-1", done.run_id), ("d-2", done.run_id)]
    assert {n["object_key"] for n in notified(folder)} == {str(first_issue), str(second_issue)}

    # Once no run of the source waits, a new delivery gets its own run again.
    inbox.put("alpha", "d-3", provider="github", event="issues", body=b"{}")
    [again] = tick(defs, instance, joined.cursor).run_requests
    assert again.tags[DELIVERIES_TAG] == "1"


def test_deliveries_for_several_sources_at_one_tick_make_one_batched_run(
    tmp_path: Path, instance, demo_api: DemoAPIServer, warehouse_url: str, monkeypatch
) -> None:
    path = write_config(tmp_path, demo_api.url)
    config = yaml.safe_load(path.read_text())
    beta = {**config["sources"][0], "name": "beta", "table": "beta"}
    beta["webhook"] = {**beta["webhook"], "path": "/hooks/beta"}
    config["sources"].append(beta)
    config["watches"].append({**config["watches"][0], "name": "beta_updates", "source": "beta"})
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    monkeypatch.setenv(INBOX_ENV, str(tmp_path / "inbox.sqlite"))
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    defs = build_definitions(load_config(path))
    batch = defs.resolve_job_def(BATCH_JOB)
    assert batch.execute_in_process(
        instance=instance, run_config=batch_run_config(["alpha", "beta"])
    ).success  # the silent baselines
    [number] = demo_api.tracker.mutate(update=1)["updated"]
    inbox = Inbox(tmp_path / "inbox.sqlite")
    for source, delivery in (("alpha", "a-1"), ("beta", "b-1"), ("beta", "b-2")):
        inbox.put(source, delivery, provider="github", event="issues", body=b"{}")

    first = tick(defs, instance)
    [request] = first.run_requests  # one run for both sources, not one each
    assert request.job_name == BATCH_JOB
    assert batch_sources(request.run_config) == ["alpha", "beta"]
    assert request.tags[TRIGGER_TAG] == "webhook" and request.tags[DELIVERIES_TAG] == "3"
    assert [r.run_key for r in tick(defs, instance).run_requests] == [request.run_key]

    # While it waits in the queue, new deliveries for its sources join it.
    queued = instance.create_run_for_job(
        batch,
        run_config=request.run_config,
        status=dg.DagsterRunStatus.NOT_STARTED,
        tags=request.tags,
    )
    inbox.put("alpha", "a-2", provider="github", event="issues", body=b"{}")
    joined = tick(defs, instance, first.cursor)
    assert joined.run_requests == []

    instance.delete_run(queued.run_id)
    done = batch.execute_in_process(
        instance=instance, run_config=request.run_config, tags=request.tags
    )
    assert done.success
    assert [consumer for _, consumer in inbox_rows(tmp_path)] == [done.run_id] * 4
    # Each source's change of the issue, each watch's notification, once.
    assert sorted((n["watch"], n["object_key"]) for n in notified(tmp_path)) == [
        ("beta_updates", str(number)),
        ("updates", str(number)),
    ]
    assert tick(defs, instance, joined.cursor).run_requests == []
