"""The README's main command, `changewatch demo`, run as a user would, in a fresh folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance, DagsterRunStatus

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAGSTER"))}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=cwd,
        env=environ | env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def sync_lines(output: str) -> list[tuple[int, int, int, int]]:
    pattern = r"(\d+) inserted, (\d+) updated, (\d+) deleted, (\d+) unchanged"
    return [tuple(map(int, m)) for m in re.findall(pattern, output)]


def test_demo_tells_the_whole_story(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "watches.yaml").write_text((REPO / "watches.yaml").read_text())
    (tmp_path / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    done = run_cli(
        "demo", "--issues", "25", "--update", "4", "--delete", "2", "--create", "1", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # First sync: all new; second: nothing; third: exactly what the API changed.
    assert sync_lines(done.stdout) == [(25, 0, 0, 0), (0, 0, 0, 25), (1, 4, 2, 19)]
    database = tmp_path / ".changewatch" / "warehouse.duckdb"
    assert f"warehouse: {database}" in done.stdout
    with duckdb.connect(str(database), read_only=True) as con:
        kinds = con.execute(
            "SELECT kind, count(*) FROM issues_changes GROUP BY kind ORDER BY kind"
        ).fetchall()
        assert kinds == [("delete", 2), ("insert", 26), ("update", 4)]
    # The three syncs are Dagster runs, recorded in the instance under DAGSTER_HOME (this
    # folder, because it holds dagster.yaml), where `dagster dev` shows them.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 3
        assert {run.status for run in runs} == {DagsterRunStatus.SUCCESS}
        assert {run.tags.get("changewatch/source") for run in runs} == {"demo_issues"}

    # Running the demo again tells the same story: it starts from a clean slate.
    again = run_cli(
        "demo", "--issues", "25", "--update", "4", "--delete", "2", "--create", "1", cwd=tmp_path
    )
    assert sync_lines(again.stdout) == sync_lines(done.stdout)


def test_sql_command_reads_the_warehouse(tmp_path: Path) -> None:
    database = tmp_path / "w.duckdb"
    with duckdb.connect(str(database)) as con:
        con.execute("CREATE TABLE t AS SELECT 41 + 1 AS answer")
    done = run_cli(
        "sql",
        "SELECT answer FROM t",
        cwd=tmp_path,
        CHANGEWATCH_WAREHOUSE_URL=f"duckdb:///{database}",
    )
    assert done.returncode == 0, done.stderr
    assert "42" in done.stdout
