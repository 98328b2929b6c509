"""The sync sensor: one run key per source and slot, evaluated by hand and by the real daemon.

The first tests drive the sensor factory with a controllable clock. The daemon test loads the
code location from pipeline/definitions/code_location.py (in a real gRPC code server) against a real
SQLite instance configured with the project's dagster.yaml `concurrency` block, ticks the sensor
with Dagster's sensor daemon and launches the queued runs with the queued-run-coordinator daemon,
which runs them in real subprocesses against the demo API and a DuckDB warehouse.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.cli.in_process_runs import source_job_assets
from changewatch.pipeline.definitions.build_definitions import build_definitions, run_selections
from changewatch.pipeline.polling.poll_slots import jitter_offset
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.pipeline.triggers.sync_sensors import (
    SYNC_JOB,
    SYNC_SENSOR,
    sync_job_name,
    sync_sensor,
)
from changewatch.sources.base import ProbeSettings
from changewatch.warehouse import connect
from dagster._core.scheduler.instigation import InstigatorType, TickStatus
from dagster._core.test_utils import create_test_daemon_workspace_context, freeze_time
from dagster._core.workspace.load_target import PythonFileTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from dagster._daemon.sensor import execute_sensor_iteration
from patience import descendants, wait_working

REPO = Path(__file__).resolve().parents[2]
WATCHES = REPO / "watches.yaml"
SLOT_TAG = "changewatch/slot"
RUN_KEY_TAG = "dagster/run_key"


# --- the sensor with a controllable clock -------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_config(path: Path, **overrides: object) -> Path:
    """The bundled watches file with its source changed, and every file it writes (the
    notifications file, digests) kept next to ``path``, never in the working directory."""
    data = yaml.safe_load(WATCHES.read_text(encoding="utf-8"))
    source = data["sources"][0]
    old_name = source["name"]
    source.update(overrides)
    for watch in data.get("watches", []):
        # The watches follow a renamed source.
        if watch.get("source") == old_name:
            watch["source"] = source["name"]
        if "sources" in watch:
            watch["sources"] = [source["name"] if s == old_name else s for s in watch["sources"]]
    for channel in data.get("channels", []):
        if channel["type"] == "file":
            channel["path"] = str(path.parent / Path(channel["path"]).name)
    for digest in data.get("digests", []):
        if digest.get("output_dir"):
            digest["output_dir"] = str(path.parent / "digests")
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def llm_url() -> Iterator[str]:
    """An LLM endpoint that refuses connections at once: a bound port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def clocked(
    config_path: Path, clock: Clock, instance: dg.DagsterInstance
) -> Callable[[], list[dg.RunRequest]]:
    """Evaluate the sensor of ``config_path``'s interval sources at ``clock``'s time, without
    probes (tests/pipeline/test_probe_sensor.py has those): a sync at every slot."""
    config = load_config(config_path)
    defs = build_definitions(config, environ={})
    off = ProbeSettings(enabled=False)
    unprobed = [s.model_copy(update={"probe": off}) for s in config.sources]
    job = next(j for j in defs.jobs or [] if j.name == SYNC_JOB)
    sensor = sync_sensor(unprobed, job, run_selections(config), clock=clock)  # type: ignore[arg-type]
    full = dg.Definitions(
        assets=defs.assets, jobs=defs.jobs, sensors=[sensor], resources=defs.resources
    )

    def evaluate() -> list[dg.RunRequest]:
        context = dg.build_sensor_context(instance=instance, definitions=full)
        return list(sensor.evaluate_tick(context).run_requests or [])

    return evaluate


def key_at(evaluate: Callable[[], list[dg.RunRequest]], clock: Clock, when: float) -> str:
    clock.now = when
    [request] = evaluate()
    return request.run_key  # type: ignore[return-value]


def boundary(evaluate, clock: Clock, low: float, high: float) -> float:
    """The first moment in (low, high] whose run key differs from the one at ``low``."""
    first = key_at(evaluate, clock, low)
    assert key_at(evaluate, clock, high) != first
    while high - low > 1e-6:
        middle = (low + high) / 2
        low, high = (middle, high) if key_at(evaluate, clock, middle) == first else (low, middle)
    return high


def test_run_key_is_stable_within_a_slot_and_changes_in_the_next(instance):
    config = load_config(WATCHES)
    source = config.source("demo_issues")
    clock = Clock(0.0)
    evaluate = clocked(WATCHES, clock, instance)

    start = boundary(evaluate, clock, 1_800_000_000.0, 1_800_000_000.0 + source.interval)
    inside = [start + f * source.interval for f in (0, 0.001, 0.25, 0.5, 0.999)]
    keys = {key_at(evaluate, clock, t) for t in inside}
    assert len(keys) == 1, keys
    [key] = keys
    name, slot = key.split(":")
    assert name == source.name
    assert key_at(evaluate, clock, start - 0.001) == f"{name}:{int(slot) - 1}"
    assert key_at(evaluate, clock, start + source.interval) == f"{name}:{int(slot) + 1}"
    # Each slot lasts exactly one interval.
    assert boundary(evaluate, clock, start, start + 1.5 * source.interval) == pytest.approx(
        start + source.interval, abs=1e-5
    )

    clock.now = start + source.interval / 3
    [request] = evaluate()
    assert request.job_name == sync_job_name(source) == SYNC_JOB
    assert request.asset_selection == run_selections(config)[source.name]
    assert request.tags[SOURCE_TAG] == source.name
    assert request.tags[SLOT_TAG] == slot


def test_jitter_shifts_slots_by_a_stable_offset_without_changing_their_length(tmp_path, instance):
    config = load_config(WATCHES)
    source = config.source("demo_issues")
    assert 0 < source.jitter < source.interval
    clock = Clock(0.0)
    jittered = clocked(WATCHES, clock, instance)
    plain = clocked(write_config(tmp_path / "plain.yaml", jitter=0), clock, instance)

    origin = 1_800_000_000.0 - 1_800_000_000.0 % source.interval  # a multiple of the interval
    plain_start = boundary(plain, clock, origin - source.interval / 2, origin + source.interval / 2)
    assert plain_start == pytest.approx(origin, abs=1e-5)
    start = boundary(jittered, clock, origin - 1e-3, origin + source.interval - 1e-3)
    offset = start - origin
    assert 0 <= offset < source.jitter
    assert offset == pytest.approx(jitter_offset(source.name, source.jitter), abs=1e-5)
    # The slot still lasts one interval, and the shift is the same one slot later ...
    assert boundary(jittered, clock, start, start + 1.5 * source.interval) == pytest.approx(
        start + source.interval, abs=1e-5
    )
    # ... and after a restart: a new sensor built from the same file keys the same slots.
    again = clocked(WATCHES, clock, instance)
    for t in (start, start + source.interval / 2, start + source.interval - 1e-3):
        assert key_at(again, clock, t) == key_at(jittered, clock, t)
    # Another source with the same schedule gets its own offset, so they do not fire together.
    other = clocked(write_config(tmp_path / "other.yaml", name="other_issues"), clock, instance)
    other_start = boundary(other, clock, origin - 1e-3, origin + source.interval - 1e-3)
    assert other_start - origin != pytest.approx(offset, abs=1e-3)


# --- the real sensor daemon and queued run coordinator -----------------------------------------

# Seconds: two ticks fit in one slot even on a loaded machine (a tick is a gRPC call and a few
# writes), and waiting for the next slot stays short. Ticks that straddle a boundary anyway
# are tried again, up to SLOT_ATTEMPTS times.
INTERVAL = 10.0
SLOT_ATTEMPTS = 10


def sleep_until_slot_start(interval: float) -> int:
    """Sleep to just after the next slot boundary; returns that slot's index."""
    slot = math.floor(time.time() / interval) + 1
    time.sleep(max(0.0, slot * interval + 0.05 - time.time()))
    return slot


def tick(workspace, at: float) -> None:
    # The daemon's own clock decides whether minimum_interval_seconds has passed; the sensor's
    # slot comes from the real clock in the code server.
    with freeze_time(at):
        list(execute_sensor_iteration(workspace, logging.getLogger("test_sensor"), None, None))


def ticks(instance: dg.DagsterInstance) -> list:
    [state] = instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
    return list(reversed(instance.get_ticks(state.instigator_origin_id, state.selector_id)))


def wait_for_success(instance: dg.DagsterInstance, run_id: str) -> None:
    """Wait while the run's worker (a process this test started, through the code server)
    works or its event log grows: slowness is not failure, a stall is (tests/patience.py)."""

    def finished() -> bool:
        run = instance.get_run_by_id(run_id)
        return run is not None and run.is_finished

    wait_working(
        finished,
        pids=lambda: descendants(os.getpid()),
        progress=lambda: len(instance.all_logs(run_id)),
        what=f"run {run_id}",
    )
    errors = [
        str(event.dagster_event.step_failure_data.error)
        for event in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    ]
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS, errors


def launch_queued(workspace) -> None:
    list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(workspace))


@contextmanager
def daemon_workspace() -> Iterator[tuple[dg.DagsterInstance, object]]:
    """A test instance with the project's concurrency settings, and a daemon workspace that
    loads the code location from pipeline/definitions/code_location.py as `dagster dev` would."""
    project = yaml.safe_load((REPO / "dagster.yaml").read_text(encoding="utf-8"))
    target = PythonFileTarget(
        python_file=str(REPO / "pipeline" / "definitions" / "code_location.py"),
        attribute=None,
        working_directory=str(REPO),
        location_name="changewatch",
    )
    with (
        dg.instance_for_test(overrides={"concurrency": project["concurrency"]}) as instance,
        create_test_daemon_workspace_context(target, instance) as workspace,
    ):
        yield instance, workspace


@pytest.mark.e2e  # a real dagster-daemon
def test_daemon_requests_one_run_per_slot_and_runs_one_sync_per_source_at_a_time(
    demo_env, tmp_path, monkeypatch, llm_url
):
    # Without probes: a run per slot, whether the demo API changed or not.
    config_file = write_config(
        tmp_path / "watches.yaml", interval=f"{INTERVAL:g}s", jitter=0, probe=False
    )
    warehouse = f"duckdb:///{tmp_path / 'warehouse.duckdb'}"
    monkeypatch.setenv("CHANGEWATCH_CONFIG", str(config_file))
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse)
    # The code server and its runs inherit this: the security_review judge fails fast.
    monkeypatch.setenv("CHANGEWATCH_LLM_BASE_URL", llm_url)
    config = load_config()
    interval_sources = [s for s in config.sources if s.cron is None]
    assert [s.name for s in interval_sources] == ["demo_issues"]
    with daemon_workspace() as (instance, workspace):
        at = time.time()  # the daemon's clock: each tick past the sensor's minimum interval

        def tick_now() -> tuple[int, int]:
            """Tick; the slots the real clock was in when the tick began and ended."""
            nonlocal at
            begun = time.time()
            at = max(at, begun) + 31
            tick(workspace, at)
            return math.floor(begun / INTERVAL), math.floor(time.time() / INTERVAL)

        # -- two ticks in one slot: one queued run; the second requests the same key: no run ----
        for _ in range(SLOT_ATTEMPTS):
            sleep_until_slot_start(INTERVAL)
            before = len(ticks(instance)) if instance.all_instigator_state() else 0
            slot, _ = tick_now()
            _, end = tick_now()
            if end == slot:
                break
            # A slow machine: the second tick began a new slot. Drop its runs and try again.
            for run in instance.get_runs():
                instance.delete_run(run.run_id)
        else:
            pytest.fail(f"no two sensor ticks fitted in one {INTERVAL:g}s slot")
        runs = instance.get_runs()
        assert len(runs) == len(interval_sources) == 1
        [first] = runs
        assert first.status == dg.DagsterRunStatus.QUEUED
        assert first.job_name == SYNC_JOB
        assert first.tags[SOURCE_TAG] == "demo_issues"
        assert first.tags[RUN_KEY_TAG] == f"demo_issues:{slot}"
        assert first.tags[SLOT_TAG] == str(slot)
        assert first.tags["dagster/sensor_name"] == SYNC_SENSOR
        assert len(ticks(instance)) == before + 2  # the sensor was evaluated again, not skipped
        latest = ticks(instance)[-1]
        assert latest.status == TickStatus.SKIPPED
        assert latest.run_ids == []

        # -- a later slot while that run still waits: no second run, it will sync the source ----
        sleep_until_slot_start(INTERVAL)
        tick_now()
        assert len(ticks(instance)) == before + 3
        assert [r.run_id for r in instance.get_runs()] == [first.run_id]

        # -- the coordinator launches it; the next slot then asks a new run ------------------------
        launch_queued(workspace)
        assert instance.get_run_by_id(first.run_id).status != dg.DagsterRunStatus.QUEUED
        sleep_until_slot_start(INTERVAL)
        begun, ended = tick_now()
        runs = instance.get_runs()
        assert len(runs) == 2
        second = next(r for r in runs if r.run_id != first.run_id)
        next_slot = int(second.tags[SLOT_TAG])
        assert slot < begun <= next_slot <= ended
        assert second.tags[RUN_KEY_TAG] == f"demo_issues:{next_slot}"
        assert second.tags[SOURCE_TAG] == "demo_issues"
        assert second.status == dg.DagsterRunStatus.QUEUED

        # -- one sync of the source at a time: while the first runs, the second waits its turn ----
        launch_queued(workspace)
        if not instance.get_run_by_id(first.run_id).is_finished:  # not finished during the launch
            assert instance.get_run_by_id(second.run_id).status == dg.DagsterRunStatus.QUEUED

        wait_for_success(instance, first.run_id)
        launch_queued(workspace)  # the tag's slot is free again
        wait_for_success(instance, second.run_id)

        records = instance.fetch_materializations(dg.AssetKey("issues"), limit=10).records
        by_run = {
            r.run_id: {k: v.value for k, v in r.asset_materialization.metadata.items()}
            for r in records
        }
        issues = len(demo_env.tracker)
        assert by_run[first.run_id]["inserted"] == issues
        assert by_run[second.run_id]["inserted"] == 0
        assert by_run[second.run_id]["unchanged"] == issues

        # Each sync run carried its changes through evaluation to delivery.
        job_assets = {dg.AssetKey(a) for a in source_job_assets(config, ["demo_issues"])}
        assert job_assets == {
            dg.AssetKey(a)
            for a in ("issues", "eval_new_bugs", "eval_closed_issues", "eval_security_review")
            + ("notifications",)
        }
        for run_id in (first.run_id, second.run_id):
            materialized = {
                event.dagster_event.asset_key
                for event in instance.all_logs(
                    run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
                )
            }
            assert materialized == job_assets

    # New bugs were notified by the first run only; the second run found nothing new.
    bugs = sorted(
        str(issue["number"])
        for issue in demo_env.tracker.snapshot()
        if "bug" in {label["name"] for label in issue["labels"]}
    )
    assert bugs
    lines = (tmp_path / "notifications.jsonl").read_text(encoding="utf-8").splitlines()
    assert sorted(json.loads(line)["object_key"] for line in lines) == bugs
    assert {json.loads(line)["watch"] for line in lines} == {"new_bugs"}

    with connect(warehouse) as wh:
        assert wh.fetch('SELECT count(*) FROM "issues"') == [(issues,)]
        rows = wh.fetch("SELECT dagster_run_id, status FROM sync_runs ORDER BY started_at")
    assert rows == [(first.run_id, "succeeded"), (second.run_id, "succeeded")]


def test_the_daemon_ticks_the_sync_sensor_no_sooner_than_polling_tick(
    demo_env, tmp_path, monkeypatch, llm_url
):
    config_file = write_config(tmp_path / "watches.yaml", interval="10s", jitter=0, probe=False)
    data = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    config_file.write_text(yaml.safe_dump(data | {"polling": {"tick": "2m"}}), encoding="utf-8")
    monkeypatch.setenv("CHANGEWATCH_CONFIG", str(config_file))
    monkeypatch.setenv(WAREHOUSE_URL_ENV, f"duckdb:///{tmp_path / 'warehouse.duckdb'}")
    monkeypatch.setenv("CHANGEWATCH_LLM_BASE_URL", llm_url)
    with daemon_workspace() as (instance, workspace):
        start = time.time()
        evaluated = []
        # The daemon's clock: a minute after the first tick is too soon, two minutes is not.
        for later in (0, 31, 61, 119, 121, 181, 242):
            tick(workspace, start + later)
            evaluated.append(len(ticks(instance)))
    assert evaluated == [1, 1, 1, 1, 2, 2, 3]


def test_demo_config_without_the_demo_api_starts_no_runs_until_its_sensor_is_started(
    tmp_path, monkeypatch, llm_url
):
    """`dagster dev` on the bundled watches.yaml after `changewatch demo`: nothing serves
    the demo API, so its sensor starts stopped and the daemon requests nothing that can only
    fail; started by hand (once `changewatch demo-api` runs), it syncs the demo source."""
    config_file = write_config(tmp_path / "watches.yaml", jitter=0)
    monkeypatch.setenv("CHANGEWATCH_CONFIG", str(config_file))
    monkeypatch.delenv("CHANGEWATCH_DEMO_URL", raising=False)
    monkeypatch.setenv(WAREHOUSE_URL_ENV, f"duckdb:///{tmp_path / 'warehouse.duckdb'}")
    monkeypatch.setenv("CHANGEWATCH_LLM_BASE_URL", llm_url)
    with daemon_workspace() as (instance, workspace):
        tick(workspace, time.time())
        tick(workspace, time.time() + 31)
        assert instance.get_runs() == []
        location = workspace.create_request_context().get_code_location("changewatch")
        [repository] = location.get_repositories().values()
        [sensor] = repository.get_sensors()
        assert sensor.name == "sync_demo_api"
        assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
        assert "changewatch demo-api" in (sensor.description or "")
        assert not instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id)

        # Started from the UI: it requests the demo source's job like the interval sensor.
        instance.start_sensor(sensor)
        tick(workspace, time.time() + 62)
        [run] = instance.get_runs()
        assert run.job_name == SYNC_JOB
        assert run.status == dg.DagsterRunStatus.QUEUED
