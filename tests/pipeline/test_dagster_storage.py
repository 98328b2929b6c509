"""Dagster instance settings: the project's dagster.yaml, and its documented PostgreSQL storage.

The PostgreSQL storage block is the one commented in dagster.yaml, uncommented verbatim, so the
documentation is what gets tested. It runs against a database of its own, created and dropped
here, never the shared `test` database.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import psycopg2
import pytest
import yaml
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.assets.watch_assets import NOTIFICATIONS_ASSET
from changewatch.pipeline.cli.in_process_runs import source_job_assets
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.warehouse import connect
from dagster._core.run_coordinator import QueuedRunCoordinator

REPO = Path(__file__).resolve().parents[2]
PROJECT_DAGSTER_YAML = REPO / "dagster.yaml"


def documented_postgres_storage() -> dict:
    """The commented-out `storage: postgres:` block of dagster.yaml, uncommented."""
    lines = PROJECT_DAGSTER_YAML.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "# storage:")
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("#   "):
            break
        block.append(line)
    return yaml.safe_load("\n".join(line[2:] for line in block))


def test_project_dagster_yaml_is_a_valid_instance_config(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(PROJECT_DAGSTER_YAML, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))

    with dg.DagsterInstance.get() as instance:
        assert not instance.is_ephemeral
        assert Path(instance.root_directory) == home
        # SQLite storage under DAGSTER_HOME, created on first use.
        assert type(instance.run_storage).__name__ == "SqliteRunStorage"
        assert instance.get_runs() == []
        assert (home / "history" / "runs.db").is_file()

        assert instance.event_log_storage.get_pool_config().default_pool_limit == 1

        coordinator = instance.run_coordinator
        assert isinstance(coordinator, QueuedRunCoordinator)
        # A pass of the queue every second: a webhook's run waits for the next one.
        assert coordinator.dequeue_interval_seconds == 1
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == 4
        limits = [dict(limit) for limit in queue.tag_concurrency_limits]
        assert {
            "key": SOURCE_TAG,
            "value": {"applyLimitPerUniqueValue": True},
            "limit": 1,
        } in limits
        assert instance.get_settings("telemetry")["enabled"] is False


@pytest.fixture
def llm_url() -> Iterator[str]:
    """An LLM endpoint that refuses connections at once: a bound port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def test_documented_postgres_storage_records_runs_and_materializations(
    tmp_path, monkeypatch, demo_env, dagster_db, llm_url
):
    storage = documented_postgres_storage()
    assert storage["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}
    settings = yaml.safe_load(PROJECT_DAGSTER_YAML.read_text(encoding="utf-8"))
    settings["storage"] = storage["storage"]
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_db)
    warehouse = f"duckdb:///{tmp_path / 'warehouse.duckdb'}"
    monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse)
    monkeypatch.setenv("CHANGEWATCH_LLM_BASE_URL", llm_url)  # the judge fails fast
    monkeypatch.chdir(tmp_path)  # the notifications file and digests are written here

    config = load_config()
    defs = build_definitions(config)
    job_assets = source_job_assets(config, ["demo_issues"])
    assert set(job_assets) == {
        "issues",
        "eval_new_bugs",
        "eval_closed_issues",
        "eval_security_review",
        NOTIFICATIONS_ASSET,
    }
    [digest] = config.digests
    # Yesterday: the last day that has ended, so the last partition.
    day = (datetime.now(ZoneInfo(digest.timezone)).date() - timedelta(days=1)).isoformat()
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        # The warehouse pool limit from dagster.yaml lives in the Postgres storage too.
        assert instance.event_log_storage.get_pool_config().default_pool_limit == 1
        # What the sync job runs: sync, evaluate, deliver.
        result = dg.materialize(
            list(defs.assets),  # type: ignore[arg-type]
            selection=job_assets,
            instance=instance,
            resources=defs.resources,
            tags={SOURCE_TAG: "demo_issues"},
        )
        assert result.success
        [run] = instance.get_runs()
        assert run.run_id == result.run_id
        assert run.status == dg.DagsterRunStatus.SUCCESS
        event = instance.get_latest_materialization_event(dg.AssetKey("issues"))
        assert event is not None and event.run_id == result.run_id
        assert event.asset_materialization.metadata["inserted"].value == len(demo_env.tracker)
        for name in job_assets:
            event = instance.get_latest_materialization_event(dg.AssetKey(name))
            assert event is not None and event.run_id == result.run_id, name

        # Then one day of the partitioned digest: the partition is recorded in Postgres too.
        sent = dg.materialize(
            list(defs.assets),  # type: ignore[arg-type]
            selection=[f"digest_{digest.name}"],
            instance=instance,
            resources=defs.resources,
            partition_key=day,
        )
        assert sent.success
        assert instance.get_run_by_id(sent.run_id).tags["dagster/partition"] == day
        assert instance.get_materialized_partitions(dg.AssetKey(f"digest_{digest.name}")) == {day}

    # What Dagster wrote is in the dedicated database: read it back with plain SQL.
    plain_url = dagster_db.replace("postgresql+psycopg2://", "postgresql://")
    with closing(psycopg2.connect(plain_url)) as con:
        with con.cursor() as cur:
            cur.execute("SELECT run_id, status, pipeline_name FROM runs ORDER BY id")
            assert cur.fetchall() == [
                (result.run_id, "SUCCESS", "__ephemeral_asset_job__"),
                (sent.run_id, "SUCCESS", "__ephemeral_asset_job__"),
            ]
            cur.execute(
                "SELECT run_id, count(*) FROM event_logs WHERE dagster_event_type = %s "
                "GROUP BY run_id",
                ("ASSET_MATERIALIZATION",),
            )
            assert dict(cur.fetchall()) == {result.run_id: len(job_assets), sent.run_id: 1}
    # And the sync itself went to the DuckDB warehouse, not to Dagster's database.
    with connect(warehouse) as wh:
        assert wh.fetch('SELECT count(*) FROM "issues"') == [(len(demo_env.tracker),)]
        [(evaluated,)] = wh.fetch("SELECT count(DISTINCT watch) FROM evaluations")
        assert evaluated == len(config.watches)
    assert (tmp_path / ".changewatch" / "notifications.jsonl").is_file()
