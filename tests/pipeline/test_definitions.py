"""The Dagster definitions built from a watches file: asset graph, jobs, sensor and schedules.

Built from the real bundled watches.yaml (and small variants written to tmp_path), and checked
once more the way a deployment loads them: `dagster definitions validate -w workspace.yaml`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from pipeline.assets import SOURCE_TAG, WAREHOUSE_POOL
from pipeline.config import load_config
from pipeline.resources import WAREHOUSE_URL_ENV, WarehouseResource
from pipeline.sensors import SYNC_SENSOR, sync_job_name
from pipeline.wiring import build_definitions
from warehouse import DEFAULT_URL

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


def test_bundled_config_builds_one_sync_asset_per_source(defs):
    config = load_config(WATCHES)
    tables = [s.table for s in config.sources]
    assert tables, "the bundled watches.yaml declares no source"
    assert set(defs.resolve_all_asset_keys()) == {dg.AssetKey(t) for t in tables}

    by_key = {a.key: a for a in defs.assets}  # type: ignore[union-attr]
    for source in config.sources:
        asset = by_key[dg.AssetKey(source.table)]
        assert asset.group_names_by_key[asset.key] == "sync"
        # One slot in this pool serialises every warehouse writer (DuckDB has one writer).
        assert asset.op.pool == WAREHOUSE_POOL == "warehouse"
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
        assert "warehouse" in asset.required_resource_keys


def test_one_in_process_job_per_source_tagged_with_the_source(defs):
    config = load_config(WATCHES)
    user_jobs = {j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__")}
    assert user_jobs == {sync_job_name(s) for s in config.sources} == {"sync_demo_issues"}
    for source in config.sources:
        job = defs.resolve_job_def(sync_job_name(source))
        assert job.executor_def is dg.in_process_executor
        assert job.tags[SOURCE_TAG] == source.name
        assert job.asset_layer.executable_asset_keys == {dg.AssetKey(source.table)}


def test_interval_sources_share_one_sensor_and_have_no_schedule(defs):
    sensor = defs.resolve_sensor_def(SYNC_SENSOR)
    assert sensor.name == "sync_due_sources"
    assert [t.job_name for t in sensor.targets] == ["sync_demo_issues"]
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert [s.name for s in defs.get_repository_def().sensor_defs] == [SYNC_SENSOR]
    assert defs.get_repository_def().schedule_defs == []


def test_cron_source_gets_a_schedule_and_stays_out_of_the_sensor(tmp_path):
    data = bundled()
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
    [schedule] = repo.schedule_defs
    assert schedule.name == "sync_nightly_issues_schedule"
    assert schedule.cron_schedule == cron_source["cron"]
    assert schedule.execution_timezone == cron_source["timezone"]
    assert schedule.job_name == "sync_nightly_issues"
    assert schedule.tags[SOURCE_TAG] == "nightly_issues"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING

    sensor = defs.resolve_sensor_def(SYNC_SENSOR)
    assert [t.job_name for t in sensor.targets] == [f"sync_{interval_source['name']}"]
    assert set(defs.resolve_all_asset_keys()) == {
        dg.AssetKey(interval_source["table"]),
        dg.AssetKey("nightly_issues"),
    }


def test_only_cron_sources_means_no_sensor(tmp_path):
    data = bundled()
    data["sources"][0]["cron"] = "0 * * * *"
    defs = build_definitions(load_config(write_config(tmp_path / "w.yaml", data)), environ={})
    repo = defs.get_repository_def()
    assert repo.sensor_defs == []
    assert [s.job_name for s in repo.schedule_defs] == [f"sync_{data['sources'][0]['name']}"]
    assert repo.schedule_defs[0].execution_timezone == "UTC"


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


def run_validate(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Without DAGSTER_HOME the CLI uses a throwaway instance. Run outside the repo: there, the
    # CLI would pick up the project's dagster.yaml, which needs DAGSTER_HOME set.
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env["CHANGEWATCH_CONFIG"] = str(config)
    return subprocess.run(
        [str(DAGSTER_CLI), "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
        cwd=cwd,  # workspace.yaml resolves its python_file relative to itself
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dagster_validates_the_workspace_with_the_bundled_config(tmp_path):
    result = run_validate(WATCHES, tmp_path)
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
