"""The probing sync sensor, evaluated against a real Dagster instance and real demo APIs.

Two sources, each on its own demo API (so a change in one is not a change in the other); the
sensor's clock is controlled, its probes go over loopback HTTP, and its cursor goes from one
evaluation to the next as Dagster would keep it. The last test runs the requested syncs for
real, on both warehouse backends.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.assets.batched_syncs import BATCH_JOB, BATCH_OP, batch_run_config
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.definitions.build_definitions import (
    SYNC_JOB,
    build_definitions,
    run_selections,
)
from changewatch.pipeline.polling.poll_schedule import POLL_TAG, rows_of
from changewatch.pipeline.polling.poll_slots import due_slot
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.pipeline.triggers.sync_sensors import (
    BATCH_TAG,
    SYNC_SENSOR,
    TRIGGER_TAG,
    sync_sensor,
)
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.sources.probe import ProbeClients
from changewatch.warehouse import connect

INTERVAL = 300.0
RECONCILE = 3600.0
START = 1_800_000_000.0 - 1_800_000_000.0 % INTERVAL  # a slot boundary (no jitter)


def source(name: str, base_url: str, **settings: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "rest",
        "base_url": base_url,
        "path": "/repos/acme/widgets/issues",
        "params": {"state": "all", "per_page": 100, "sort": "created", "direction": "asc"},
        "paginator": {"type": "link_header"},
        "baseline": "evaluate",
        "table": name,
        "primary_key": "number",
        "updated_at": "updated_at",
        "interval": "5m",
        "probe": {"reconcile": "1h", "timeout": "5s"},
        "columns": {"number": "bigint", "comments": "integer", "updated_at": "timestamp"},
        **settings,
    }


def write(path: Path, sources: list[dict[str, Any]], **settings: Any) -> Path:
    config = {"version": 1, "sources": sources, **settings}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


class Sensor:
    """The sync sensor of a watches file at a controlled clock, its cursor carried along."""

    def __init__(self, config_path: Path, instance: dg.DagsterInstance, clients: ProbeClients):
        self.now = START
        self.cursor: str | None = None
        config = load_config(config_path)
        self.defs = build_definitions(config, environ={})
        # A run per source, to see each one's decision (batching has tests of its own).
        self.sensor = sync_sensor(
            config.sources,
            next(j for j in self.defs.jobs or [] if j.name == SYNC_JOB),  # type: ignore[arg-type]
            run_selections(config),
            clock=lambda: self.now,
            clients=clients,
            batch=False,
        )
        self.full = dg.Definitions(
            assets=self.defs.assets,
            jobs=self.defs.jobs,
            sensors=[self.sensor],
            resources=self.defs.resources,
        )
        self.instance = instance

    def tick(self, at: float | None = None) -> list[dg.RunRequest]:
        if at is not None:
            self.now = at
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, definitions=self.full
        )
        result = self.sensor.evaluate_tick(context)
        self.cursor = result.cursor
        return list(result.run_requests or [])


def keys(requests: list[dg.RunRequest]) -> dict[str, str]:
    """Source name -> run key."""
    return {r.tags[SOURCE_TAG]: r.run_key for r in requests}  # type: ignore[misc]


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture
def clients() -> Iterator[ProbeClients]:
    with ProbeClients() as pool:
        yield pool


@pytest.fixture
def apis() -> Iterator[tuple[DemoAPIServer, DemoAPIServer]]:
    with (
        DemoAPIServer(DemoTracker(issues=40, seed=1)) as one,
        DemoAPIServer(DemoTracker(issues=40, seed=2)) as two,
    ):
        yield one, two


@pytest.fixture
def dead_url() -> Iterator[str]:
    """An address that refuses connections: a bound port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def requests_seen(*servers: DemoAPIServer) -> int:
    return sum(s.stats()["requests"] for s in servers)


def test_first_tick_syncs_then_nothing_until_a_change(tmp_path, instance, clients, apis):
    one, two = apis
    config = write(tmp_path / "w.yaml", [source("alpha", one.url), source("beta", two.url)])
    sensor = Sensor(config, instance, clients)

    # No probe state yet: every source counts as changed.
    first = sensor.tick()
    assert sorted(keys(first)) == ["alpha", "beta"]
    for request in first:
        name = request.tags[SOURCE_TAG]
        assert request.job_name == SYNC_JOB
        assert request.asset_selection == [dg.AssetKey(name)]
        assert request.tags[TRIGGER_TAG] == "probe"
        assert request.run_key.startswith(f"{name}:probe:none>")
    cursor = json.loads(sensor.cursor)  # type: ignore[arg-type]
    assert set(cursor["s"]) == {"alpha", "beta"}
    assert len(sensor.cursor) < 1000  # hashes, not bodies

    # Later in the same slot: not probed again, nothing requested.
    before = requests_seen(one, two)
    assert sensor.tick(START + INTERVAL / 2) == []
    assert requests_seen(one, two) == before
    # The next slot: probed (one request each), nothing changed, nothing requested.
    assert sensor.tick(START + INTERVAL) == []
    assert requests_seen(one, two) == before + 2

    # A change in alpha's tracker: the next slot syncs alpha only.
    one.tracker.mutate(update=1)
    changed = sensor.tick(START + 2 * INTERVAL)
    assert list(keys(changed)) == ["alpha"]
    [request] = changed
    assert request.tags[TRIGGER_TAG] == "probe"
    assert request.run_key != keys(first)["alpha"]
    # The change is in the cursor now: the slot after it finds nothing new.
    assert sensor.tick(START + 3 * INTERVAL) == []


def test_same_tick_from_the_same_cursor_asks_the_same_key(tmp_path, instance, clients, apis):
    # The run key comes from the data: a tick evaluated again from the same cursor (a restart
    # before Dagster kept the cursor) asks the same key, which Dagster runs once.
    one, _ = apis
    config = write(tmp_path / "w.yaml", [source("alpha", one.url)])
    sensor = Sensor(config, instance, clients)
    sensor.tick()
    one.tracker.mutate(create=1)
    kept = sensor.cursor
    again = Sensor(config, instance, clients)  # a restarted code server: a new sensor object
    again.cursor = kept
    first = keys(again.tick(START + INTERVAL))
    again.cursor = kept
    assert keys(again.tick(START + INTERVAL)) == first == {"alpha": first["alpha"]}


def test_reconciliation_syncs_when_nothing_changed(tmp_path, instance, clients, apis):
    one, _ = apis
    config = write(tmp_path / "w.yaml", [source("alpha", one.url)])
    sensor = Sensor(config, instance, clients)
    assert len(sensor.tick()) == 1  # the first probe's sync, at START
    for slot in range(1, int(RECONCILE // INTERVAL)):
        assert sensor.tick(START + slot * INTERVAL) == [], slot
    [request] = sensor.tick(START + RECONCILE)
    assert request.tags[TRIGGER_TAG] == "reconcile"
    assert request.run_key == f"alpha:reconcile:{int((START + RECONCILE) // RECONCILE)}"
    # The clock restarts from that sync: the next reconciliation is an hour later.
    assert sensor.tick(START + RECONCILE + INTERVAL) == []
    [later] = sensor.tick(START + 2 * RECONCILE)
    assert later.tags[TRIGGER_TAG] == "reconcile" and later.run_key != request.run_key


def test_a_failing_probe_falls_back_to_interval_syncs_and_others_go_on(
    tmp_path, instance, clients, apis, dead_url
):
    one, _ = apis
    config = write(tmp_path / "w.yaml", [source("alpha", one.url), source("down", dead_url)])
    sensor = Sensor(config, instance, clients)
    first = keys(sensor.tick())
    slot = due_slot(START, INTERVAL)
    assert first["down"] == f"down:{slot}"  # the interval sync, as without probes
    assert first["alpha"].startswith("alpha:probe:")
    assert sensor.tick(START + 10) == []  # same slot: requested once
    one.tracker.mutate(update=2)
    second = keys(sensor.tick(START + INTERVAL))
    assert second["down"] == f"down:{slot + 1}"
    assert second["alpha"].startswith("alpha:probe:")
    assert "p" not in json.loads(sensor.cursor)["s"]["down"]  # type: ignore[arg-type]


def test_probe_false_syncs_at_every_slot_without_a_request(tmp_path, instance, clients, apis):
    one, _ = apis
    config = write(tmp_path / "w.yaml", [source("alpha", one.url, probe=False)])
    sensor = Sensor(config, instance, clients)
    slot = due_slot(START, INTERVAL)
    assert keys(sensor.tick()) == {"alpha": f"alpha:{slot}"}
    assert keys(sensor.tick(START + INTERVAL)) == {"alpha": f"alpha:{slot + 1}"}
    assert one.stats()["requests"] == 0


def test_a_source_waiting_in_a_queued_run_is_not_asked_again(tmp_path, instance, clients, apis):
    one, two = apis
    sources = [source("alpha", one.url, probe=False), source("beta", two.url, probe=False)]
    sensor = Sensor(write(tmp_path / "w.yaml", sources), instance, clients)
    first = {r.tags[SOURCE_TAG]: r for r in sensor.tick()}
    assert set(first) == {"alpha", "beta"}
    # alpha's run waits for a worker (the daemon's queue: not begun), and beta's ran.
    queued = instance.create_run_for_job(
        sensor.defs.resolve_job_def(SYNC_JOB),
        status=dg.DagsterRunStatus.NOT_STARTED,
        tags=first["alpha"].tags,
    )
    slot = due_slot(START, INTERVAL)
    # The next slot: alpha's queued run will sync it when it begins, so only beta is asked.
    assert keys(sensor.tick(START + INTERVAL)) == {"beta": f"beta:{slot + 1}"}
    # A batched run waiting names its sources in its config: beta waits in one now.
    batched = instance.create_run_for_job(
        sensor.defs.resolve_job_def(BATCH_JOB),
        run_config=batch_run_config(["beta"]),
        status=dg.DagsterRunStatus.NOT_STARTED,
    )
    assert sensor.tick(START + 2 * INTERVAL) == []
    # Once begun (here: gone), each is asked again at its next slot.
    instance.delete_run(queued.run_id)
    instance.delete_run(batched.run_id)
    assert keys(sensor.tick(START + 3 * INTERVAL)) == {
        "alpha": f"alpha:{slot + 3}",
        "beta": f"beta:{slot + 3}",
    }


def run(defs: dg.Definitions, request: dg.RunRequest, instance: dg.DagsterInstance) -> None:
    job = defs.resolve_job_def(request.job_name)  # type: ignore[arg-type]
    result = job.execute_in_process(
        instance=instance, asset_selection=request.asset_selection, tags=request.tags
    )
    assert result.success


def test_probed_syncs_store_the_change_on_both_backends(
    tmp_path, instance, clients, apis, warehouse_url, monkeypatch
):
    one, _ = apis
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    config = write(tmp_path / "w.yaml", [source("alpha", one.url)])
    sensor = Sensor(config, instance, clients)
    defs = build_definitions(load_config(config), environ={WAREHOUSE_URL_ENV: warehouse_url})

    [first] = sensor.tick()
    run(defs, first, instance)
    assert sensor.tick(START + INTERVAL) == []
    before = comments(warehouse_url)
    [changed] = one.tracker.mutate(update=1)["updated"]
    [request] = sensor.tick(START + 2 * INTERVAL)
    assert request.tags[TRIGGER_TAG] == "probe"
    run(defs, request, instance)
    after = comments(warehouse_url)
    assert len(after) == 40
    assert after[changed] == one.tracker.get(changed)["comments"] == before[changed] + 1
    assert {n: c for n, c in after.items() if n != changed} == {
        n: c for n, c in before.items() if n != changed
    }


def comments(url: str) -> dict[int, int]:
    with connect(url) as warehouse:
        return dict(warehouse.fetch("SELECT number, comments FROM alpha"))


def test_syncs_due_at_one_tick_run_together_on_both_backends(
    tmp_path, instance, apis, warehouse_url, monkeypatch, dead_url
):
    one, two = apis
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    sources = [source("alpha", one.url), source("beta", two.url), source("down", dead_url)]
    defs = build_definitions(load_config(write(tmp_path / "w.yaml", sources)))
    # The sensor as wired for the code server (its real clock): both first probes say
    # "changed", down's probe fails so it is due at its interval.
    sensor = defs.resolve_sensor_def(SYNC_SENSOR)
    context = dg.build_sensor_context(instance=instance, definitions=defs)
    slot = due_slot(time.time(), INTERVAL)
    result = sensor.evaluate_tick(context)
    [request] = result.run_requests or []
    # One run of one step (pipeline/assets/batched_syncs.py), its config naming the sources.
    assert request.job_name == BATCH_JOB
    assert request.tags[TRIGGER_TAG] == "batch" and request.tags[BATCH_TAG] == "3"
    config = request.run_config["ops"][BATCH_OP]["config"]
    assert config["sources"] == ["alpha", "beta", "down"]
    # The sensor's schedule of each source rides in the config, not in a run tag: Dagster
    # indexes tags, and a few hundred sources' rows passed PostgreSQL's index limit.
    assert POLL_TAG not in request.tags
    assert [r.source for r in rows_of(config["poll_schedule"])] == ["alpha", "beta", "down"]
    assert request.run_key.startswith("batch:")

    job = defs.resolve_job_def(BATCH_JOB)
    done = job.execute_in_process(
        instance=instance, run_config=request.run_config, tags=request.tags, raise_on_error=False
    )
    # The unreachable source's sync fails; the others in the same run are stored all the same,
    # and reported as materializations of their own assets; the failure names the source.
    assert not done.success
    [failure] = [e for e in done.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.error.message
    assert "1 of the batch failed: down: " in message and "cannot reach" in message
    assert len(message.strip().splitlines()) == 1, message
    materialized = [
        e.asset_key.to_user_string()
        for e in done.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    ]
    assert sorted(materialized) == ["alpha", "beta"]
    with connect(warehouse_url) as warehouse:
        for table in ("alpha", "beta"):
            assert warehouse.fetch(f"SELECT count(*) FROM {table}") == [(40,)]
        # Each sync that ran recorded its schedule from the run's config.
        recorded = warehouse.fetch("SELECT source FROM poll_schedule ORDER BY source")
        assert recorded == [("alpha",), ("beta",)]
    # Nothing changed since: a tick in the same slot (the cursor kept) requests nothing. The
    # sensor runs on the real clock, so the runs above may have carried it into the next slot:
    # then alpha and beta, probed again, are still unchanged, and only down (its probe fails)
    # is due again.
    again = dg.build_sensor_context(instance=instance, definitions=defs, cursor=result.cursor)
    requests = list(sensor.evaluate_tick(again).run_requests or [])
    if due_slot(time.time(), INTERVAL) == slot:
        assert requests == []
    else:
        assert [r.tags.get(SOURCE_TAG) for r in requests] == ["down"]


def test_more_syncs_due_than_batch_max_make_several_runs_the_same_at_every_look(
    tmp_path, instance, apis, warehouse_url, monkeypatch, dead_url
):
    one, two = apis
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    names = ["alpha", "beta", "gamma", "delta", "down"]
    sources = [source(n, one.url if i % 2 else two.url) for i, n in enumerate(names[:4])]
    sources.append(source("down", dead_url))
    path = write(tmp_path / "w.yaml", sources, polling={"batch_max": 2})
    defs = build_definitions(load_config(path))
    sensor = defs.resolve_sensor_def(SYNC_SENSOR)

    def look() -> list[dg.RunRequest]:
        context = dg.build_sensor_context(instance=instance, definitions=defs)
        return list(sensor.evaluate_tick(context).run_requests or [])

    requests = look()
    # Five due, at most two to a run: three runs, as even as can be, in the sources' order.
    runs = [
        r.run_config["ops"][BATCH_OP]["config"]["sources"]
        if r.job_name == BATCH_JOB
        else [r.tags[SOURCE_TAG]]
        for r in requests
    ]
    assert runs == [["alpha"], ["beta", "delta"], ["down", "gamma"]]
    assert [r.tags.get(BATCH_TAG) for r in requests] == [None, "2", "2"]
    # The same tick looked at again (a daemon restart) asks the same runs, by their keys.
    assert [r.run_key for r in look()] == [r.run_key for r in requests]
