"""The Dagster definitions built from a watches file: asset graph, jobs, sensor and schedules.

Built from the real bundled watches.yaml (and small variants written to tmp_path), and checked
once more the way a deployment loads them: `dagster definitions validate -w workspace.yaml`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from changewatch.pipeline.assets.batched_syncs import BATCH_JOB
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG, WAREHOUSE_POOL
from changewatch.pipeline.assets.watch_assets import (
    NOTIFICATIONS_ASSET,
    WATCH_TAG,
    evaluation_asset_name,
)
from changewatch.pipeline.cli.in_process_runs import source_job_assets
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import (
    WAREHOUSE_URL_ENV,
    JudgeResource,
    WarehouseResource,
)
from changewatch.pipeline.project.watches_file import load_config
from changewatch.pipeline.triggers.sync_sensors import (
    DEMO_SENSOR,
    SYNC_JOB,
    SYNC_SENSOR,
    sync_job_name,
)
from changewatch.warehouse import DEFAULT_URL
from patience import run

REPO = Path(__file__).resolve().parents[2]
WATCHES = REPO / "watches.yaml"
DAGSTER_CLI = Path(sys.executable).with_name("dagster")


def bundled() -> dict:
    return yaml.safe_load(WATCHES.read_text(encoding="utf-8"))


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def defs() -> dg.Definitions:
    return build_definitions(load_config(WATCHES), environ={})


EVAL_ASSETS = {"eval_new_bugs", "eval_closed_issues", "eval_security_review"}
GROUPS = {
    "issues": "sync",
    "eval_new_bugs": "evaluation",
    "eval_closed_issues": "evaluation",
    "eval_security_review": "evaluation",
    "notifications": "delivery",
    "digest_daily": "digest",
}


def keys(*names: str) -> set[dg.AssetKey]:
    return {dg.AssetKey(n) for n in names}


def test_bundled_config_builds_the_asset_graph_sync_evaluation_delivery_digest(defs):
    config = load_config(WATCHES)
    assert [s.table for s in config.sources] == ["issues"]
    assert [evaluation_asset_name(w) for w in config.watches] == [
        "eval_new_bugs",
        "eval_closed_issues",
        "eval_security_review",
    ]
    assert [d.name for d in config.digests] == ["daily"]
    assert set(defs.resolve_all_asset_keys()) == keys(*GROUPS)

    graph = defs.resolve_asset_graph()
    by_key = {a.key: a for a in defs.assets}  # type: ignore[union-attr]
    for name, group in GROUPS.items():
        node = graph.get(dg.AssetKey(name))
        assert node.group_name == group, name
        # Every asset explains itself in the UI.
        assert node.description and node.description.strip(), name
        asset = by_key[dg.AssetKey(name)]
        # One slot in this pool serialises every warehouse writer (DuckDB has one writer).
        assert asset.op.pool == WAREHOUSE_POOL == "warehouse", name
        assert "warehouse" in asset.required_resource_keys, name

    # Lineage: sync -> evaluation -> notifications -> digest.
    parents = {name: graph.get(dg.AssetKey(name)).parent_keys for name in GROUPS}
    assert parents == {
        "issues": set(),
        "eval_new_bugs": keys("issues"),
        "eval_closed_issues": keys("issues"),
        "eval_security_review": keys("issues"),
        NOTIFICATIONS_ASSET: keys(*EVAL_ASSETS),
        "digest_daily": keys(NOTIFICATIONS_ASSET),
    }
    # Only the digest is partitioned: one window per day, in the digest's timezone.
    partitioned = {k for k in graph.get_all_asset_keys() if graph.get(k).partitions_def}
    assert partitioned == keys("digest_daily")


def test_sync_asset_carries_its_source_metadata(defs):
    config = load_config(WATCHES)
    by_key = {a.key: a for a in defs.assets}  # type: ignore[union-attr]
    for source in config.sources:
        asset = by_key[dg.AssetKey(source.table)]
        assert asset.group_names_by_key[asset.key] == "sync"
        tags = asset.tags_by_key[asset.key]
        assert tags[SOURCE_TAG] == source.name
        assert {"dagster/kind/python", "dagster/kind/sql"} <= set(tags)
        spec = next(iter(asset.specs))
        assert spec.description == source.description
        assert spec.metadata["source"] == source.name
        assert spec.metadata["primary_key"] == ", ".join(source.primary_key)
        assert spec.metadata["cursor_column"] == source.updated_at
        assert spec.metadata["change_log"] == f"{source.table}_changes"
        assert spec.metadata["dagster/table_name"] == source.table
        assert asset.required_resource_keys - {"io_manager"} == {"warehouse"}


def test_evaluation_delivery_and_digest_assets(defs):
    config = load_config(WATCHES)
    by_key = {a.key: a for a in defs.assets}  # type: ignore[union-attr]
    for watch in config.watches:
        asset = by_key[dg.AssetKey(evaluation_asset_name(watch))]
        tags = asset.tags_by_key[asset.key]
        assert tags[WATCH_TAG] == watch.name
        assert ("dagster/kind/openai" in tags) == (watch.judge is not None), watch.name
        assert {"dagster/kind/python", "dagster/kind/sql"} <= set(tags)
        assert next(iter(asset.specs)).description == watch.description
        assert asset.required_resource_keys - {"io_manager"} == {"warehouse", "judges"}
    assert [w.name for w in config.watches if w.judge] == ["security_review"]

    delivery = by_key[dg.AssetKey(NOTIFICATIONS_ASSET)]
    description = next(iter(delivery.specs)).description
    for channel in config.channels:
        assert channel.name in description
    assert delivery.required_resource_keys - {"io_manager"} == {"warehouse"}

    [digest] = config.digests
    asset = by_key[dg.AssetKey(f"digest_{digest.name}")]
    assert asset.required_resource_keys - {"io_manager"} == {"warehouse"}
    partitions = asset.partitions_def
    assert isinstance(partitions, dg.DailyPartitionsDefinition)
    assert partitions.timezone == digest.timezone == "UTC"
    today = datetime.now(UTC).date()
    assert partitions.start.date() == digest.first_day(today) == today - timedelta(days=7)
    assert partitions.end_offset == 0  # only days that have ended: each is sent once


def test_resources_are_the_warehouse_and_the_judges(defs):
    assert set(defs.resources) == {"warehouse", "judges"}
    assert isinstance(defs.resources["warehouse"], WarehouseResource)
    assert isinstance(defs.resources["judges"], JudgeResource)


def test_sync_job_carries_changes_to_delivery_and_digest_job_sends_the_digest(defs):
    config = load_config(WATCHES)
    user_jobs = {j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__")}
    assert {sync_job_name(s) for s in config.sources} == {SYNC_JOB}
    assert user_jobs == {SYNC_JOB, BATCH_JOB, "digest_daily_job"}
    for source in config.sources:
        job = defs.resolve_job_def(sync_job_name(source))
        assert job.executor_def is dg.in_process_executor
        expected = keys(source.table, *EVAL_ASSETS, NOTIFICATIONS_ASSET)
        assert job.asset_layer.executable_asset_keys == expected
        # The CLI runs exactly what the job runs.
        assert keys(*source_job_assets(config, [source.name])) == expected
        assert job.partitions_def is None
        assert job.description

    digest = defs.resolve_job_def("digest_daily_job")
    assert digest.executor_def is dg.in_process_executor
    assert digest.asset_layer.executable_asset_keys == keys("digest_daily")
    assert isinstance(digest.partitions_def, dg.DailyPartitionsDefinition)
    assert SOURCE_TAG not in digest.tags  # a digest run never waits for a sync's slot


def live(data: dict) -> dict:
    """``data`` with its first source on a real API instead of the demo API's address."""
    data["sources"][0]["base_url"] = "https://tracker.example.com"
    return data


def test_interval_sources_share_one_sensor_and_the_digest_has_its_schedule(tmp_path):
    config = load_config(write_config(tmp_path / "w.yaml", live(bundled())))
    defs = build_definitions(config, environ={})
    sensor = defs.resolve_sensor_def(SYNC_SENSOR)
    assert sensor.name == "sync_due_sources"
    assert [t.job_name for t in sensor.targets] == [SYNC_JOB, BATCH_JOB]
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    repo = defs.get_repository_def()
    assert [s.name for s in repo.sensor_defs] == [SYNC_SENSOR]
    # No cron source: the only schedule is the digest's.
    [schedule] = repo.schedule_defs
    assert schedule.name == "digest_daily_schedule"
    assert schedule.cron_schedule == bundled()["digests"][0]["cron"] == "0 8 * * *"
    assert schedule.execution_timezone == "UTC"
    assert schedule.job_name == "digest_daily_job"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.description


def test_digest_schedule_requests_yesterday_once(tmp_path):
    data = bundled()
    data["digests"][0]["start"] = "2026-01-01"  # the days below are partitions
    defs = build_definitions(load_config(write_config(tmp_path / "w.yaml", data)), environ={})
    schedule = defs.resolve_schedule_def("digest_daily_schedule")
    repo = defs.get_repository_def()
    for when, day in [
        (datetime(2026, 3, 2, 8, 0, tzinfo=UTC), "2026-03-01"),
        (datetime(2026, 3, 1, 8, 0, tzinfo=UTC), "2026-02-28"),
    ]:
        context = dg.build_schedule_context(scheduled_execution_time=when, repository_def=repo)
        [request] = schedule.evaluate_tick(context).run_requests or []
        assert request.partition_key == day
        # The partition is the run key: the daemon sends each day's digest once.
        assert request.run_key == f"daily:{day}"


def test_sources_on_the_demo_api_get_a_sensor_of_their_own_that_starts_stopped(tmp_path):
    # The bundled file without a running demo: its source is at the demo API's address.
    data = bundled()
    demo_source = data["sources"][0]
    assert demo_source["base_url"] == "${CHANGEWATCH_DEMO_URL:-http://127.0.0.1:8765}"
    data["sources"].append({**demo_source, "name": "live_issues", "table": "live_issues"})
    data["sources"][1]["base_url"] = "https://tracker.example.com"
    defs = build_definitions(load_config(write_config(tmp_path / "w.yaml", data)), environ={})

    repo = defs.get_repository_def()
    assert sorted(s.name for s in repo.sensor_defs) == [DEMO_SENSOR, SYNC_SENSOR]
    demo = defs.resolve_sensor_def(DEMO_SENSOR)
    assert [t.job_name for t in demo.targets] == [SYNC_JOB, BATCH_JOB]
    assert demo.default_status == dg.DefaultSensorStatus.STOPPED
    assert "changewatch demo-api" in (demo.description or "")
    other = defs.resolve_sensor_def(SYNC_SENSOR)
    assert [t.job_name for t in other.targets] == [SYNC_JOB, BATCH_JOB]
    assert other.default_status == dg.DefaultSensorStatus.RUNNING


def test_cron_source_gets_a_schedule_and_stays_out_of_the_sensor(tmp_path):
    data = live(bundled())
    interval_source = data["sources"][0]
    cron_source = {
        **interval_source,
        "name": "nightly_issues",
        "table": "nightly_issues",
        "cron": "15 3 * * 1-5",
        "timezone": "Europe/Berlin",
    }
    data["sources"].append(cron_source)
    defs = build_definitions(load_config(write_config(tmp_path / "w.yaml", data)), environ={})

    repo = defs.get_repository_def()
    schedules = {s.name: s for s in repo.schedule_defs}
    assert set(schedules) == {"sync_nightly_issues_schedule", "digest_daily_schedule"}
    schedule = schedules["sync_nightly_issues_schedule"]
    assert schedule.cron_schedule == cron_source["cron"]
    assert schedule.execution_timezone == cron_source["timezone"]
    assert schedule.job_name == SYNC_JOB
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    # No watch is over the cron source: its runs only sync it.
    [request] = schedule.evaluate_tick(dg.build_schedule_context()).run_requests
    assert request.asset_selection == [dg.AssetKey("nightly_issues")]
    assert request.tags[SOURCE_TAG] == "nightly_issues"

    sensor = defs.resolve_sensor_def(SYNC_SENSOR)
    assert [t.job_name for t in sensor.targets] == [SYNC_JOB, BATCH_JOB]
    assert set(defs.resolve_all_asset_keys()) == keys(
        interval_source["table"],
        "nightly_issues",
        *EVAL_ASSETS,
        NOTIFICATIONS_ASSET,
        "digest_daily",
    )
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("nightly_issues")).group_name == "sync"
    assert graph.get(dg.AssetKey("nightly_issues")).child_keys == set()


def test_only_cron_sources_means_no_sensor(tmp_path):
    data = bundled()
    data["sources"][0]["cron"] = "0 * * * *"
    defs = build_definitions(load_config(write_config(tmp_path / "w.yaml", data)), environ={})
    repo = defs.get_repository_def()
    assert repo.sensor_defs == []
    schedules = {s.job_name: s for s in repo.schedule_defs}
    assert set(schedules) == {SYNC_JOB, "digest_daily_job"}
    assert schedules[SYNC_JOB].execution_timezone == "UTC"


def test_warehouse_resource_comes_from_the_environment_by_name():
    config = load_config(WATCHES)
    url = "postgresql://app:hunter2-not-real@db.invalid:5432/wh"
    resource = build_definitions(config, environ={WAREHOUSE_URL_ENV: url}).resources["warehouse"]
    assert isinstance(resource, WarehouseResource)
    # Only the variable's name is stored in the resource config Dagster records and shows.
    assert resource.url == dg.EnvVar(WAREHOUSE_URL_ENV)
    assert "hunter2" not in repr(resource)

    default = build_definitions(config, environ={}).resources["warehouse"]
    assert default.url == DEFAULT_URL


def run_validate(
    config: Path, cwd: Path, dagster_home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    # Without DAGSTER_HOME the CLI uses a throwaway instance. Run outside the repo: there, the
    # CLI would pick up the project's dagster.yaml, which needs DAGSTER_HOME set.
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env["CHANGEWATCH_CONFIG"] = str(config)
    if dagster_home is not None:
        env["DAGSTER_HOME"] = str(dagster_home)
    return run(
        [str(DAGSTER_CLI), "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
        cwd=cwd,  # workspace.yaml resolves its python_file relative to itself
        env=env,
    )


def test_dagster_validates_the_workspace_with_the_bundled_config(tmp_path):
    result = run_validate(WATCHES, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Validation successful for code location changewatch" in output


def test_dagster_validates_the_workspace_under_the_project_instance(tmp_path):
    # As the README says: DAGSTER_HOME holding the project's dagster.yaml (SQLite storage,
    # pools, run queue), with the whole graph: sync, evaluation, delivery, partitioned digest.
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    result = run_validate(WATCHES, home, dagster_home=home)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Validation successful for code location changewatch" in output


def test_dagster_validate_names_file_line_and_key_of_a_bad_config(tmp_path):
    lines = WATCHES.read_text(encoding="utf-8").splitlines()
    anchor = next(i for i, line in enumerate(lines) if line.strip().startswith("jitter:"))
    indent = lines[anchor][: len(lines[anchor]) - len(lines[anchor].lstrip())]
    lines.insert(anchor + 1, f"{indent}retry_forever: true")
    bad = tmp_path / "bad-watches.yaml"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")

    result = run_validate(bad, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"{bad}:{anchor + 2}: sources[0].retry_forever: unknown key 'retry_forever'" in output
    assert "Validation successful" not in output


def test_sync_assets_are_fresh_for_two_missed_syncs_and_fail_after_three(tmp_path):
    data = live(bundled())
    interval_source = data["sources"][0]  # every 5m, jitter 20s
    weekday_source = {
        **interval_source,
        "name": "weekday_issues",
        "table": "weekday_issues",
        "cron": "15 3 * * 1-5",
        "timezone": "Europe/Berlin",
    }
    fast_source = {**interval_source, "name": "fast", "table": "fast", "interval": "5s"}
    fast_source["probe"] = False
    fast_source.pop("jitter")
    data["sources"] += [weekday_source, fast_source]
    defs = build_definitions(load_config(write_config(tmp_path / "w.yaml", data)), environ={})
    graph = defs.resolve_asset_graph()

    def windows(table: str) -> tuple[timedelta, timedelta]:
        policy = graph.get(dg.AssetKey(table)).freshness_policy
        return policy.warn_window.to_timedelta(), policy.fail_window.to_timedelta()

    # Probed: an unchanged source syncs once per probe.reconcile (1h), plus its jitter.
    period = timedelta(hours=1, seconds=20)
    assert windows("issues") == (2 * period, 3 * period)
    # Weekdays only: the longest gap is the weekend, so Monday's sync is not late on Sunday.
    assert windows("weekday_issues") == (2 * timedelta(days=3), 3 * timedelta(days=3))
    # Not probed (probe: false), a sync at every interval; Dagster's floor: at least a minute.
    assert windows("fast") == (timedelta(minutes=1), timedelta(minutes=2))
    # Only what syncs has a clock: evaluations follow their source.
    assert graph.get(dg.AssetKey("eval_new_bugs")).freshness_policy is None


def test_freshness_follows_whether_the_source_is_scheduled(tmp_path):
    """The demo API's sensor starts stopped: nothing syncs its source until someone starts
    it, so the source is not late (the UI stays green after `changewatch demo`)."""
    data = bundled()
    demo_source = data["sources"][0]
    data["sources"] += [
        {**demo_source, "name": "live", "table": "live", "base_url": "https://t.example.com"},
        {**demo_source, "name": "nightly", "table": "nightly", "cron": "0 3 * * *"},
    ]
    defs = build_definitions(load_config(write_config(tmp_path / "w.yaml", data)), environ={})
    graph = defs.resolve_asset_graph()
    fresh = {
        key.to_user_string()
        for key in graph.get_all_asset_keys()
        if graph.get(key).freshness_policy is not None
    }
    # The demo API's source: only its stopped sensor would sync it. The live one: the running
    # sync sensor. The nightly one, on the demo API too: its schedule starts running.
    assert fresh == {"live", "nightly"}
    assert defs.resolve_sensor_def(DEMO_SENSOR).default_status == dg.DefaultSensorStatus.STOPPED
    assert defs.resolve_schedule_def("sync_nightly_schedule").default_status == (
        dg.DefaultScheduleStatus.RUNNING
    )


def test_the_bundled_definitions_carry_no_freshness_policy_without_a_running_trigger(defs):
    graph = defs.resolve_asset_graph()
    assert [k for k in graph.get_all_asset_keys() if graph.get(k).freshness_policy] == []


def pools_by_asset(defs: dg.Definitions) -> dict[str, str | None]:
    return {a.key.to_user_string(): a.op.pool for a in defs.assets}  # type: ignore[union-attr]


@pytest.fixture
def config_with_retention(tmp_path: Path) -> Path:
    data = bundled()
    data["retention"] = {"changes": "90d"}  # so the retention asset exists too
    return write_config(tmp_path / "w.yaml", data)


def test_on_duckdb_every_warehouse_writer_shares_the_one_warehouse_pool(config_with_retention):
    url = "duckdb:///somewhere/warehouse.duckdb"
    for environ in ({}, {WAREHOUSE_URL_ENV: url}):
        defs = build_definitions(load_config(config_with_retention), environ=environ)
        pools = pools_by_asset(defs)
        assert set(pools) == set(GROUPS) | {"retention"}
        # A DuckDB file admits one writing process: one slot in one pool serialises them all.
        assert set(pools.values()) == {WAREHOUSE_POOL}


def test_a_learned_stage_s_training_asset_waits_for_the_warehouse_writers(tmp_path: Path):
    """It only reads the warehouse, but a DuckDB file cannot be opened while another process
    writes it: on DuckDB it shares the writers' one slot; on PostgreSQL a pool of its own."""
    data = bundled()
    data["watches"][0]["judge"] = [
        {"condition": "Anything that matters.", "model": "learned"},
        {"model": "m", "base_url": "http://127.0.0.1:9/v1", "when": "unsure"},
    ]
    config = load_config(write_config(tmp_path / "w.yaml", data))
    name = f"learned_{config.watches[0].name}"
    for url, pool in (
        ("duckdb:///somewhere/warehouse.duckdb", WAREHOUSE_POOL),
        ("postgresql://cw@db:5432/cw", f"warehouse/learning/{config.watches[0].name}"),
    ):
        defs = build_definitions(config, environ={WAREHOUSE_URL_ENV: url})
        assert pools_by_asset(defs)[name] == pool, url


def test_on_postgres_each_asset_has_its_own_pool_so_sources_sync_at_once(config_with_retention):
    for url in ("postgresql://cw@db:5432/cw?schema=watch", "postgresql+psycopg2://cw@db/cw"):
        defs = build_definitions(
            load_config(config_with_retention), environ={WAREHOUSE_URL_ENV: url}
        )
        assert pools_by_asset(defs) == {
            "issues": "warehouse/source/demo_issues",
            "eval_new_bugs": "warehouse/watch/new_bugs",
            "eval_closed_issues": "warehouse/watch/closed_issues",
            "eval_security_review": "warehouse/watch/security_review",
            NOTIFICATIONS_ASSET: "warehouse/notifications",
            "digest_daily": "warehouse/digest/daily",
            "retention": "warehouse/retention",
        }
        # The jobs run their steps under the same pools the assets declare.
        job = defs.resolve_job_def(sync_job_name(load_config(config_with_retention).sources[0]))
        assert {node.definition.pool for node in job.graph.node_dict.values()} == {
            "warehouse/source/demo_issues",
            "warehouse/watch/new_bugs",
            "warehouse/watch/closed_issues",
            "warehouse/watch/security_review",
            "warehouse/notifications",
        }
