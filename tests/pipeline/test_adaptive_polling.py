"""Adaptive polling and stop conditions, through the sync sensor on a real Dagster instance.

The sensor's clock is controlled; its probes go over loopback HTTP to the demo API, or to a
small server answering 429 with ``Retry-After`` or 500 on demand; its cursor goes from one
evaluation to the next as Dagster would keep it. Pauses live in the instance, and
``changewatch resume`` (in process, on the same instance) clears them. The last tests run
the requested runs for real and read ``poll_schedule`` on both warehouse backends.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.cli.command_line import main
from changewatch.pipeline.definitions.build_definitions import build_definitions, run_selections
from changewatch.pipeline.polling.poll_schedule import (
    POLL_SCHEDULE_JOB,
    POLL_TAG,
    merged_tag,
    rows_of,
    schedule_tag,
)
from changewatch.pipeline.polling.probe_decisions import Schedule, load_cursor
from changewatch.pipeline.polling.source_pauses import NOT_PAUSED_CHECK, paused_reasons
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.pipeline.triggers.sync_sensors import SYNC_JOB, TRIGGER_TAG, sync_sensor
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.sources.probe import ProbeClients
from changewatch.sources.ratelimit import RateLimits
from changewatch.warehouse import connect
from changewatch.warehouse.poll_schedule import PollRow

START = 1_800_000_000.0  # 2027-01-15T08:00:00Z
MIN, MAX = 60.0, 3600.0


def source(name: str, base_url: str, **settings: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "rest",
        "base_url": base_url,
        "path": "/repos/acme/widgets/issues",
        "params": {"state": "all", "per_page": 100},
        "paginator": {"type": "link_header"},
        "baseline": "evaluate",
        "table": name,
        "primary_key": "number",
        "interval": "10m",
        "min_interval": MIN,
        "max_interval": MAX,
        "probe": {"reconcile": "1d", "timeout": "5s"},
        "columns": {"number": "bigint", "comments": "integer"},
        **settings,
    }


class Sensor:
    """The sync sensor of a watches file at a controlled clock, its cursor carried along."""

    def __init__(self, path: Path, instance: dg.DagsterInstance, clients: ProbeClients):
        self.now = START
        self.cursor: str | None = None
        config = load_config(path)
        # The warehouse of the test (runs read the URL from the environment), never the
        # default one in the working directory.
        url = os.environ.get(WAREHOUSE_URL_ENV, f"duckdb:///{path.parent / 'unused.duckdb'}")
        self.defs = build_definitions(config, environ={WAREHOUSE_URL_ENV: url})
        jobs = {job.name: job for job in self.defs.jobs or []}
        # A run per source, to see each one's decision (batching has tests of its own).
        self.sensor = sync_sensor(
            config.sources,
            jobs[SYNC_JOB],  # type: ignore[arg-type]
            run_selections(config),
            clock=lambda: self.now,
            clients=clients,
            batch=False,
            schedule_job=jobs.get(POLL_SCHEDULE_JOB),  # type: ignore[arg-type]
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

    def envelope(self, name: str) -> list[Any]:
        return load_cursor(self.cursor)[name]["e"]


class Trouble:
    """A loopback API answering what ``answer`` says: ``(status, headers)``, and counting."""

    def __init__(self) -> None:
        self.answer: tuple[int, dict[str, str]] = (500, {})
        self.requests = 0
        trouble = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                trouble.requests += 1
                status, headers = trouble.answer
                body = b"[]" if status == 200 else b'{"message": "nope"}'
                self.send_response(status)
                for key, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def write(path: Path, sources: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"version": 1, "sources": sources}), encoding="utf-8")
    return path


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    """A persistent instance in DAGSTER_HOME, so `changewatch resume` finds the same one."""
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text("", encoding="utf-8")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as inst:
        yield inst


@pytest.fixture
def clients() -> Iterator[ProbeClients]:
    # Rate limits of their own: a 429's two-hour Retry-After must not outlive this test in
    # the process's registry (a later test's server may get the same port).
    with ProbeClients(limits=RateLimits()) as pool:
        yield pool


@pytest.fixture
def trouble() -> Iterator[Trouble]:
    server = Trouble()
    yield server
    server.close()


def by_source(requests: list[dg.RunRequest]) -> dict[str, dg.RunRequest]:
    return {r.tags[SOURCE_TAG]: r for r in requests if SOURCE_TAG in r.tags}


def check(instance: dg.DagsterInstance, table: str) -> Any:
    key = dg.AssetCheckKey(dg.AssetKey(table), NOT_PAUSED_CHECK)
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    return record.event.dagster_event.event_specific_data  # the AssetCheckEvaluation


def test_changes_tighten_quiet_probes_widen_and_restarts_keep_the_schedule(
    tmp_path, instance, clients
):
    with DemoAPIServer(DemoTracker(issues=20, seed=3)) as api:
        config = write(tmp_path / "w.yaml", [source("alpha", api.url)])
        sensor = Sensor(config, instance, clients)

        # First probe (no state: changed): a sync, and the interval from 10m to 2m30s.
        [first] = sensor.tick()
        assert first.tags[TRIGGER_TAG] == "probe"
        [row] = rows_of(first.tags[POLL_TAG])
        assert (row.next_due, row.interval_s) == (START + 150, 150.0)
        assert row.reason == "changed: interval 10m -> 2m30s"
        # The tag reads as words in the UI's list of runs.
        assert first.tags[POLL_TAG] == (
            "alpha: next 2027-01-15T08:02:30Z, every 150s: changed: interval 10m -> 2m30s "
            "(decided 2027-01-15T08:00:00Z)"
        )
        seen = api.stats()["requests"]

        # Not due yet: no probe at all.
        assert sensor.tick(START + 149) == []
        assert api.stats()["requests"] == seen
        # Due: probed, nothing changed, no run; the interval holds after one quiet probe.
        assert sensor.tick(START + 150) == []
        assert api.stats()["requests"] == seen + 1
        assert sensor.envelope("alpha")[:2] == [150.0, START + 300]

        # A change: a sync, and the interval down to the floor.
        api.tracker.mutate(update=1)
        [change] = sensor.tick(START + 300)
        assert change.tags[TRIGGER_TAG] == "probe" and change.run_key != first.run_key
        assert sensor.envelope("alpha")[:2] == [MIN, START + 360]

        # Quiet probes widen it again, each at its due time, never sooner than min_interval.
        probes, at, intervals = [], START + 360, []
        for _ in range(30):
            sensor.tick(at)
            probes.append(at)
            intervals.append(sensor.envelope("alpha")[0])
            at = sensor.envelope("alpha")[1]
        assert api.stats()["requests"] == seen + 2 + 30
        assert intervals == sorted(intervals) and intervals[-1] > 2 * MIN
        assert min(b - a for a, b in zip(probes, probes[1:], strict=False)) >= MIN

        # A restarted code server (a new sensor, Dagster's kept cursor) keeps the schedule:
        # nothing before the due time, not a fresh start at 10m or a probe at once.
        again = Sensor(config, instance, clients)
        again.cursor = sensor.cursor
        before = api.stats()["requests"]
        assert again.tick(at - 1) == [] and api.stats()["requests"] == before
        assert again.tick(at) == [] and api.stats()["requests"] == before + 1


def test_a_429_retry_after_is_honoured_beyond_max_interval(tmp_path, instance, clients, trouble):
    trouble.answer = (429, {"Retry-After": "7200"})
    config = write(tmp_path / "w.yaml", [source("alpha", trouble.url)])
    sensor = Sensor(config, instance, clients)
    # Rate limited: no sync (it would be deferred too); the next probe after the Retry-After,
    # although max_interval is an hour.
    assert sensor.tick() == []
    assert trouble.requests == 1
    interval, due, _, failures, reason = sensor.envelope("alpha")
    assert failures == 1 and due >= START + 7200 - 5
    assert "Retry-After 2h" in reason
    for at in (START + MIN, START + MAX, START + 7000):
        assert sensor.tick(at) == []
    assert trouble.requests == 1


def test_500s_back_off_then_max_failures_pauses_until_resumed(
    tmp_path, instance, clients, trouble, capsys
):
    trouble.answer = (500, {})
    settings = {"interval": "2m", "stop": {"max_failures": 3}}
    config = write(tmp_path / "w.yaml", [source("alpha", trouble.url, **settings)])
    sensor = Sensor(config, instance, clients)

    # Failures back off exponentially (2m*2, 2m*4); each asks one sync, keyed by its due time.
    [retry] = sensor.tick()
    assert retry.run_key == f"alpha:retry:{int(START)}"
    assert sensor.envelope("alpha")[1:4] == [START + 240, 0, 1]
    assert sensor.tick(START + 239) == [] and trouble.requests == 1
    [retry] = sensor.tick(START + 240)
    assert retry.run_key == f"alpha:retry:{int(START + 240)}"
    assert sensor.envelope("alpha")[1] == START + 240 + 480

    # The third failure in a row pauses it: no sync, its check fails with the reason, and a
    # run records the pause in poll_schedule.
    [record] = sensor.tick(START + 720)
    assert record.job_name == POLL_SCHEDULE_JOB
    [row] = rows_of(record.tags[POLL_TAG])
    assert row.paused and row.next_due is None
    assert row.reason.startswith("3 failed probes in a row (stop.max_failures: 3); the last:")
    assert "HTTP 500" in row.reason
    [(name, reason)] = paused_reasons(instance, "source", ["alpha"]).items()
    assert name == "alpha" and reason == row.reason
    evaluation = check(instance, "alpha")
    assert not evaluation.passed and "changewatch resume alpha" in evaluation.description

    # Paused: never probed, never synced, whatever the clock says.
    for at in (START + 3600, START + 86400 * 2):
        assert sensor.tick(at) == []
    assert trouble.requests == 3

    # The sensor's tick log (what the UI shows of a tick) said why, in one line.
    log = capsys.readouterr().err
    assert f"alpha: paused: {row.reason}; `changewatch resume alpha` resumes it" in log
    assert "alpha: next probe in 8m: failed 2 in a row: waiting 8m" in log

    # `changewatch resume alpha`: one line; the sensor probes it at its next tick, afresh.
    assert main(["--config", str(config), "resume", "alpha"]) == 0
    assert capsys.readouterr().out.startswith("source alpha: resumed (paused since ")
    assert check(instance, "alpha").passed
    trouble.answer = (200, {})
    requests = sensor.tick(START + 86400 * 2 + 30)
    assert trouble.requests == 4
    assert by_source(requests)["alpha"].tags[TRIGGER_TAG] == "probe"
    [resumed] = [r for r in requests if r.job_name == POLL_SCHEDULE_JOB]
    [row] = rows_of(resumed.tags[POLL_TAG])
    assert not row.paused and row.consecutive_failures == 0
    # Resuming what is not paused says so; an unknown name is one line and a non-zero exit.
    capsys.readouterr()
    assert main(["--config", str(config), "resume", "alpha"]) == 0
    assert capsys.readouterr().out == "source alpha: not paused\n"
    assert main(["--config", str(config), "resume", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err == "changewatch: no source or watch 'nosuch' in the watches file (known: alpha)\n"


def test_until_pauses_without_a_probe_and_resume_refuses(tmp_path, instance, clients, capsys):
    with DemoAPIServer(DemoTracker(issues=5, seed=1)) as api:
        late = source("alpha", api.url, stop={"until": "2020-01-01"})
        config = write(tmp_path / "w.yaml", [late])
        sensor = Sensor(config, instance, clients)
        [record] = sensor.tick()
        assert record.job_name == POLL_SCHEDULE_JOB
        assert api.stats()["requests"] == 0
        reason = "stop.until 2020-01-02T00:00:00+00:00 has passed"
        assert paused_reasons(instance, "source", ["alpha"]) == {"alpha": reason}
        assert not check(instance, "alpha").passed
        capsys.readouterr()  # the sensor's log
        assert main(["--config", str(config), "resume", "alpha"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("changewatch: source alpha: its stop.until (2020-01-02T00:00")
        assert "\n" not in err
        assert sensor.tick(START + 3600) == [] and api.stats()["requests"] == 0


def run(defs: dg.Definitions, request: dg.RunRequest, instance: dg.DagsterInstance) -> None:
    job = defs.resolve_job_def(request.job_name)  # type: ignore[arg-type]
    result = job.execute_in_process(
        instance=instance, asset_selection=request.asset_selection, tags=request.tags
    )
    assert result.success


def schedule_rows(url: str) -> dict[str, tuple]:
    with connect(url) as wh:
        rows = wh.fetch(
            "SELECT source, next_due, interval_s, reason, consecutive_failures, paused "
            "FROM poll_schedule"
        )
    return {row[0]: row[1:] for row in rows}


def test_runs_write_the_schedule_and_pauses_on_both_backends(
    tmp_path, instance, clients, warehouse_url, monkeypatch
):
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    api = DemoAPIServer(DemoTracker(issues=10, seed=2)).start()
    try:
        settings = {"stop": {"max_failures": 2}}
        config = write(tmp_path / "w.yaml", [source("alpha", api.url, **settings)])
        sensor = Sensor(config, instance, clients)
        defs = sensor.full
        [first] = sensor.tick()
        run(defs, first, instance)
        [(due, interval, reason, failures, paused)] = schedule_rows(warehouse_url).values()
        assert due.timestamp() == START + 150 and interval == 150.0
        assert (reason, failures, paused) == ("changed: interval 10m -> 2m30s", 0, False)
        # The run's materialization shows it too, and its check passed.
        event = instance.get_latest_materialization_event(dg.AssetKey("alpha"))
        metadata = event.asset_materialization.metadata  # type: ignore[union-attr]
        assert metadata["poll_reason"].value == reason
        assert check(instance, "alpha").passed
    finally:
        api.stop()
    # The API is gone: two failed probes (each asks a sync, which fails), then a pause.
    retry = by_source(sensor.tick(START + 150))["alpha"]
    assert retry.run_key == f"alpha:retry:{int(START + 150)}"
    [record] = sensor.tick(sensor.envelope("alpha")[1])
    run(defs, record, instance)
    row = schedule_rows(warehouse_url)["alpha"]
    assert row[0] is None and row[3:] == (2, True)
    assert row[2].startswith("2 failed probes in a row")
    # The same decision again (a retried run) changes nothing; an older one cannot win.
    run(defs, record, instance)
    late = dg.RunRequest(job_name=POLL_SCHEDULE_JOB, tags={POLL_TAG: first.tags[POLL_TAG]})
    run(defs, late, instance)  # the first decision, replayed late
    assert schedule_rows(warehouse_url)["alpha"] == row
    assert (
        rows_of(record.tags[POLL_TAG])[0].decided_at > rows_of(first.tags[POLL_TAG])[0].decided_at
    )


def test_the_schedule_tag_reads_as_words_and_back() -> None:
    schedules = {
        "alpha": Schedule(START + 150, 150.0, "changed: interval 10m -> 2m30s"),
        "beta": Schedule(None, 157.5, "3 failed probes in a row; the last:\nHTTP 500", 3, True),
    }
    one = schedule_tag(schedules, ["alpha"], START)
    tag = merged_tag([one, schedule_tag(schedules, ["beta", "gone"], START + 0.25)])
    assert tag.splitlines() == [
        "alpha: next 2027-01-15T08:02:30Z, every 150s: changed: interval 10m -> 2m30s "
        "(decided 2027-01-15T08:00:00Z)",
        "beta: paused, every 157.5s, 3 failed: 3 failed probes in a row; the last: HTTP 500 "
        "(decided 2027-01-15T08:00:00.250000Z)",
    ]
    assert rows_of(tag) == [
        PollRow("alpha", START + 150, 150.0, "changed: interval 10m -> 2m30s", 0, False, START),
        PollRow(
            "beta",
            None,
            157.5,
            "3 failed probes in a row; the last: HTTP 500",
            3,
            True,
            START + 0.25,
        ),
    ]
    assert [row.source for row in rows_of(tag, ["beta"])] == ["beta"]
    # A run the sensor requested before the upgrade carries JSON: still read.
    old = json.dumps({"at": START, "s": {"alpha": [START + 150, 150.0, "changed", 0, False]}})
    assert rows_of(old) == [PollRow("alpha", START + 150, 150.0, "changed", 0, False, START)]


def test_each_target_of_a_fleet_keeps_its_own_envelope(tmp_path, instance, clients):
    from changewatch.pipeline.triggers.fleet_assets import fleet_sensor

    repos = ["acme/widgets", "acme/gadgets"]
    trackers = [DemoTracker(issues=6, seed=s, repo=r) for s, r in zip((1, 2), repos, strict=True)]
    with DemoAPIServer(trackers[0], more=[trackers[1]]) as api:
        fleet = source("team", api.url, path="/repos/{target}/issues", interval="5m")
        fleet |= {"for_each": {"values": repos}, "target_column": "repo", "table": "team"}
        config = load_config(write(tmp_path / "w.yaml", [fleet]))
        defs = build_definitions(config, environ={})
        clock = [START]
        sensor = fleet_sensor(
            config.sources, list(defs.jobs or []), clock=lambda: clock[0], clients=clients
        )
        full = dg.Definitions(
            assets=defs.assets, jobs=defs.jobs, sensors=[sensor], resources=defs.resources
        )

        def tick(at: float, cursor: str | None) -> tuple[list[dg.RunRequest], str | None]:
            clock[0] = at
            context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=full)
            result = sensor.evaluate_tick(context)
            return list(result.run_requests or []), result.cursor

        # The first probes (both "changed"): one run over both, each at a quarter of 5m.
        requests, cursor = tick(START, None)
        assert [r.job_name for r in requests] == ["sync_team"]
        envelopes = {name: entry["e"] for name, entry in load_cursor(cursor).items()}
        assert envelopes["team[acme/widgets]"][:2] == [75.0, START + 75]
        # One target changes: its interval tightens to the floor, the other's holds.
        trackers[0].mutate(update=1)
        requests, cursor = tick(START + 75, cursor)
        assert [r.job_name for r in requests] == ["sync_team"]
        envelopes = {name: entry["e"] for name, entry in load_cursor(cursor).items()}
        assert envelopes["team[acme/widgets]"][0] == MIN
        assert envelopes["team[acme/gadgets]"][0] == 75.0
