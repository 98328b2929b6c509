"""What the CLI's runs leave behind: the job they ran under, and where they say they went."""

from __future__ import annotations

from pathlib import Path

import yaml
from changewatch.sources.demo import DemoAPIServer
from cw_testing import demo_source_settings
from dagster import DagsterInstance, DagsterRunStatus
from test_cli import run_cli

COLUMNS = {"number": "bigint", "title": "text", "state": "text", "updated_at": "timestamp"}


def write_watches(folder: Path, url: str) -> Path:
    """Two sources over the demo API, one watch over the first."""
    sources = [
        demo_source_settings(url, COLUMNS),
        demo_source_settings(url, COLUMNS, name="demo_again", table="issues_again"),
    ]
    watch = {
        "name": "closed",
        "source": "demo_issues",
        "where": "new.state = 'closed'",
        "channels": ["console"],
    }
    config = {"sources": sources, "channels": [{"name": "console", "type": "console"}]}
    path = folder / "watches.yaml"
    path.write_text(yaml.safe_dump(config | {"watches": [watch]}))
    return path


def test_sync_runs_each_source_in_the_sync_job_and_says_where(
    tmp_path: Path, demo_api: DemoAPIServer, warehouse_url: str
) -> None:
    home, work = tmp_path / "dagster_home", tmp_path / "elsewhere"
    home.mkdir()
    work.mkdir()
    config = write_watches(tmp_path, demo_api.url)
    # A password in the URL (the test server trusts any) must never be printed.
    url = warehouse_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    env = {
        "CHANGEWATCH_CONFIG": str(config),
        "CHANGEWATCH_WAREHOUSE_URL": url,
        "DAGSTER_HOME": str(home),
    }
    done = run_cli("sync", cwd=work, **env)
    assert done.returncode == 0, done.stdout + done.stderr

    # One run per source, of the sync job (as the sensor runs it), not an ad-hoc job.
    with DagsterInstance.from_config(str(home)) as instance:
        runs = sorted(instance.get_runs(), key=lambda run: run.tags["changewatch/source"])
        assert [run.job_name for run in runs] == ["sync_sources", "sync_sources"]
        assert {run.status for run in runs} == {DagsterRunStatus.SUCCESS}
        assert [run.tags["changewatch/source"] for run in runs] == ["demo_again", "demo_issues"]
        # Each selects its own source's assets only.
        assert [sorted(k.to_user_string() for k in run.asset_selection or []) for run in runs] == [
            ["issues_again"],
            ["eval_closed", "issues", "notifications"],
        ]

    first = done.stdout.splitlines()[0]
    if url.startswith("duckdb"):
        assert first == f"dagster instance: {home}  warehouse: {tmp_path / 'warehouse.duckdb'}"
    else:
        assert "s3cret" not in done.stdout + done.stderr
        schema = url.rsplit("=", 1)[1]
        assert first == (
            f"dagster instance: {home}  warehouse: "
            f"postgresql://postgres@127.0.0.1:5432/test?schema={schema}"
        )
    assert "issues: fetched 40 rows" in done.stdout
    assert "issues_again: fetched 40 rows" in done.stdout


def test_info_names_the_config_instance_and_warehouse(tmp_path: Path) -> None:
    bare = run_cli("info", cwd=tmp_path)
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.splitlines() == [
        f"watches file: {tmp_path / 'watches.yaml'} (missing)",
        "dagster instance: ephemeral (runs are not kept; set DAGSTER_HOME to keep them)  "
        f"warehouse: {tmp_path / '.changewatch' / 'warehouse.duckdb'}",
    ]
    home = run_cli("info", cwd=tmp_path, DAGSTER_HOME=str(tmp_path))
    assert home.returncode == 0, home.stderr
    assert f"dagster instance: {tmp_path}  warehouse: " in home.stdout
