"""A fleet source in Dagster, on DuckDB and PostgreSQL: a partition per target, added and retired
with the file's list by the fleet sensor, one target or the whole fleet per run, and a watch
over the fleet told about every target's changes. Real demo APIs on loopback, a real instance.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.assets.rejected_records_check import REJECTED_CHECK
from changewatch.pipeline.cli.command_line import summarize
from changewatch.pipeline.cli.in_process_runs import sync_source
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.expected_errors import ConfigError, RunFailed
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.pipeline.triggers.fleet_assets import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    TARGETS_CHECK,
    TARGETS_TAG,
    fleet_sensor,
)
from changewatch.pipeline.triggers.sync_sensors import SYNC_JOB, TRIGGER_TAG
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from changewatch.warehouse import connect

REPOS = ["acme/a", "acme/b"]
INTERVAL = 300.0
START = 1_800_000_000.0 - 1_800_000_000.0 % INTERVAL  # a slot boundary (no jitter)


@pytest.fixture
def api() -> Iterator[DemoAPIServer]:
    first, second = (
        DemoTracker(issues=n, seed=s, repo=r)
        for n, s, r in zip((12, 8), (1, 2), REPOS, strict=True)
    )
    with DemoAPIServer(first, more=[second]) as server:
        yield server


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def fleet(base_url: str, **for_each: Any) -> dict[str, Any]:
    return {
        "name": "team",
        "type": "rest",
        "table": "team_issues",
        "base_url": base_url,
        "path": "/repos/{target}/issues",
        "params": {"state": "all", "per_page": 100},
        "paginator": {"type": "link_header"},
        "for_each": for_each or {"values": REPOS},
        "target_column": "repo",
        "primary_key": "number",
        "updated_at": "updated_at",
        "baseline": "evaluate",
        "interval": "5m",
        "probe": {"timeout": "5s"},
        "columns": {"number": "bigint", "title": "text", "updated_at": "timestamp"},
    }


def write(folder: Path, sources: list[dict[str, Any]], *, where: str = "kind = 'insert'") -> Path:
    config = {
        "version": 1,
        "sources": sources,
        "channels": [{"name": "out", "type": "file", "path": str(folder / "out.jsonl")}],
        "watches": [{"name": "news", "source": "team", "where": where, "channels": ["out"]}],
    }
    path = folder / "watches.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


class Sensor:
    """The fleet sensor of a watches file at a controlled clock; its cursor carried along and
    its partition requests applied to the instance, as the daemon would."""

    def __init__(self, path: Path, instance: dg.DagsterInstance, env: dict[str, str]) -> None:
        config = load_config(path)
        self.defs = build_definitions(config, environ=env)
        fleets = [s for s in config.sources if s.name == "team"]
        self.sensor = fleet_sensor(fleets, list(self.defs.jobs or []), clock=lambda: self.now)  # type: ignore[arg-type]
        self.instance = instance
        self.now = START
        self.cursor: str | None = None

    def tick(self, at: float | None = None) -> list[dg.RunRequest]:
        self.now = self.now if at is None else at
        context = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, definitions=self.defs
        )
        result = self.sensor.evaluate_tick(context)
        self.cursor = result.cursor
        for request in result.dynamic_partitions_requests or []:
            name = request.partitions_def_name
            if isinstance(request, dg.AddDynamicPartitionsRequest):
                self.instance.add_dynamic_partitions(name, request.partition_keys)
            else:
                for key in request.partition_keys:
                    self.instance.delete_dynamic_partition(name, key)
        return list(result.run_requests or [])

    def partitions(self) -> list[str]:
        return list(self.instance.get_dynamic_partitions("team_targets"))


def count(url: str, query: str) -> dict[str, int]:
    with connect(url) as wh:
        return dict(wh.fetch(query))


ROWS = "SELECT repo, count(*) FROM team_issues GROUP BY repo"


def test_a_fleet_runs_per_target_and_whole_and_its_watch_sees_every_target(
    tmp_path: Path,
    api: DemoAPIServer,
    instance: dg.DagsterInstance,
    warehouse_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)  # the resource reads it in the run
    env = {WAREHOUSE_URL_ENV: warehouse_url}
    sensor = Sensor(write(tmp_path, [fleet(api.url, values=[*REPOS, "acme/gone"])]), instance, env)
    # The first tick adds a partition per target and probes each: one run over the fleet.
    [request] = sensor.tick()
    assert sensor.partitions() == [*REPOS, "acme/gone"]
    assert request.job_name == "sync_team" and request.tags[TARGETS_TAG] == "3"
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("acme/a", "acme/gone")

    # One partition, as a backfill of one target runs it.
    job = sensor.defs.resolve_job_def("sync_team")
    one = job.execute_in_process(instance=instance, partition_key="acme/b")
    assert count(warehouse_url, ROWS) == {"acme/b": 8}
    [event] = [e for e in one.get_asset_materialization_events() if e.asset_key == FLEET_KEY]
    assert event.materialization.partition == "acme/b"
    assert event.materialization.metadata["inserted"].value == 8

    # The sensor's run: every target, each on its own, then the watch over the fleet. The
    # unknown repository fails alone; the others are stored, evaluated and told.
    whole = job.execute_in_process(instance=instance, tags=request.tags)
    assert whole.success
    assert count(warehouse_url, ROWS) == {"acme/a": 12, "acme/b": 8}
    synced = {
        e.materialization.partition
        for e in whole.get_asset_materialization_events()
        if e.asset_key == FLEET_KEY
    }
    assert synced == {*REPOS, "acme/gone"}  # one materialization per partition of the run
    [check] = [c for c in whole.get_asset_check_evaluations() if c.check_name == TARGETS_CHECK]
    assert not check.passed and "acme/gone" in (check.description or "")
    with connect(warehouse_url) as wh:
        told = [json.loads(k) for (k,) in wh.fetch("SELECT object_key FROM outbox")]
        state = dict(wh.fetch("SELECT source, row_count FROM sync_state"))
    assert count_by(told, "repo") == {"acme/a": 12, "acme/b": 8}
    assert state == {"team[acme/a]": 12, "team[acme/b]": 8}


def count_by(keys: list[dict[str, Any]], field: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for key in keys:
        found[key[field]] = found.get(key[field], 0) + 1
    return found


def test_partitions_follow_the_file_and_a_change_asks_a_run_of_its_target(
    tmp_path: Path, api: DemoAPIServer, instance: dg.DagsterInstance
) -> None:
    sensor = Sensor(write(tmp_path, [fleet(api.url)]), instance, {})
    assert len(sensor.tick()) == 1  # first probes: both targets are new
    assert sensor.tick(START + INTERVAL) == []  # nothing changed
    api.trackers["acme/b"].mutate(update=1)
    before = sensor.cursor
    [request] = sensor.tick(START + 2 * INTERVAL)
    assert request.tags[TRIGGER_TAG] == "probe" and request.tags[TARGETS_TAG] == "1"
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("acme/b", "acme/b")
    # The same tick from the same cursor asks the same run (Dagster drops the repeat).
    sensor.cursor = before
    assert [r.run_key for r in sensor.tick()] == [request.run_key]

    # A target added to the file gets a partition and a first probe; one removed is retired.
    api.trackers["acme/c"] = DemoTracker(issues=3, seed=3, repo="acme/c")
    moved = Sensor(write(tmp_path, [fleet(api.url, values=["acme/b", "acme/c"])]), instance, {})
    moved.cursor = sensor.cursor
    [request] = moved.tick(START + 3 * INTERVAL)
    assert moved.partitions() == ["acme/b", "acme/c"]
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("acme/c", "acme/c")
    assert json.loads(moved.cursor or "")["s"].keys() == {"team[acme/b]", "team[acme/c]"}


FLEET_KEY = dg.AssetKey("team_issues")


def org_repos(base_url: str) -> dict[str, Any]:
    """The organization's repository listing, synced like any source."""
    return {
        "name": "org_repos",
        "type": "rest",
        "table": "org_repos",
        "base_url": base_url,
        "path": "/orgs/acme/repos",
        "primary_key": "full_name",
        "columns": {"full_name": "text", "issues": "bigint"},
    }


def test_a_query_fleet_reads_its_targets_in_a_run_and_retires_those_that_go(
    tmp_path: Path,
    api: DemoAPIServer,
    instance: dg.DagsterInstance,
    warehouse_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    query = "SELECT full_name FROM org_repos WHERE issues > 0 ORDER BY full_name"
    path = write(tmp_path, [org_repos(api.url), fleet(api.url, query=query)])
    sensor = Sensor(path, instance, {WAREHOUSE_URL_ENV: warehouse_url})
    # No partition yet, and the sensor never reads the warehouse: it asks the targets job.
    [request] = sensor.tick()
    assert request.job_name == "resolve_team_targets" and sensor.partitions() == []

    run = sensor.defs.resolve_job_def
    assert run(SYNC_JOB).execute_in_process(instance=instance).success
    assert run(request.job_name).execute_in_process(instance=instance).success
    assert sensor.partitions() == REPOS
    [request] = sensor.tick(START + INTERVAL)  # each target's first probe: both due
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == tuple(REPOS)
    assert run("sync_team").execute_in_process(instance=instance, tags=request.tags).success
    assert count(warehouse_url, ROWS) == {"acme/a": 12, "acme/b": 8}

    # acme/b leaves the organization: the fleet's next run reads the query again and retires
    # its partition; its rows stay (history), nothing syncs it any more.
    del api.trackers["acme/b"]
    assert run(SYNC_JOB).execute_in_process(instance=instance).success
    done = run("sync_team").execute_in_process(instance=instance, partition_key="acme/a")
    assert done.success and sensor.partitions() == ["acme/a"]
    assert count(warehouse_url, ROWS) == {"acme/a": 12, "acme/b": 8}


def test_a_targets_query_over_a_table_no_source_writes_is_refused_at_load(
    tmp_path: Path, api: DemoAPIServer
) -> None:
    path = write(tmp_path, [fleet(api.url, query="SELECT full_name FROM org_repo")])
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    [line] = str(refused.value).splitlines()
    assert "sources[0].for_each.query" in line
    assert "table 'org_repo' is no source's table" in line


def test_a_fleet_named_sources_is_refused_at_load(tmp_path: Path, api: DemoAPIServer) -> None:
    path = write(tmp_path, [fleet(api.url) | {"name": "sources"}])
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    # (The file's watch, over `team`, is refused too: it names a source no longer there.)
    [line] = [line for line in str(refused.value).splitlines() if "sources[0].name" in line]
    assert "a fleet cannot be named 'sources': sync_sources is the job of plain sources" in line


def test_changewatch_sync_of_a_fleet_syncs_every_target_and_names_the_failed_one(
    tmp_path: Path,
    api: DemoAPIServer,
    instance: dg.DagsterInstance,
    warehouse_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
    config = load_config(write(tmp_path, [fleet(api.url, values=[*REPOS, "acme/gone"])]))
    with pytest.raises(RunFailed) as failed:
        sync_source(config, "team", instance)  # what `changewatch sync team` runs
    assert str(failed.value).startswith(
        "team_issues failed: acme/gone: FetchError: team[acme/gone]"
    )
    assert "the other targets were stored and evaluated" in str(failed.value)
    line = summarize("team_issues", failed.value.results["team_issues"])
    assert line == (
        "team_issues: 2 target(s) synced, 1 failed -> 20 inserted, 0 updated, 0 deleted, "
        "0 unchanged"
    )
    assert instance.get_dynamic_partitions("team_targets") == [*REPOS, "acme/gone"]
    assert count(warehouse_url, ROWS) == {"acme/a": 12, "acme/b": 8}


def test_a_skipping_fleet_warns_of_its_targets_rejected_records(
    tmp_path: Path,
    api: DemoAPIServer,
    instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"duckdb:///{tmp_path / 'w.duckdb'}"
    monkeypatch.setenv(WAREHOUSE_URL_ENV, url)
    team = fleet(api.url) | {"on_bad_record": "skip"}
    # A title is no bigint: every record of both targets is rejected, and the runs go on.
    team["columns"] = {**team["columns"], "title": "bigint"}
    sensor = Sensor(write(tmp_path, [team]), instance, {WAREHOUSE_URL_ENV: url})
    [request] = sensor.tick()
    run = sensor.defs.resolve_job_def("sync_team").execute_in_process(
        instance=instance, tags=request.tags
    )
    assert run.success
    [check] = [c for c in run.get_asset_check_evaluations() if c.check_name == REJECTED_CHECK]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.metadata["rejected_records"].value == 20
    assert count(url, "SELECT source, count(*) FROM rejected_records GROUP BY source") == {
        "team[acme/a]": 12,
        "team[acme/b]": 8,
    }
