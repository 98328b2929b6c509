"""`changewatch info` names the watches file, Dagster instance and warehouse without loading
Dagster, polars or a database driver: it answers at once, whatever the machine's load."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest
from patience import run

HEAVY = {"dagster", "polars", "duckdb", "pyarrow", "openai", "sqlglot", "pydantic", "psycopg2"}
# Runs `changewatch info` in a fresh interpreter, then prints the heavy packages it imported.
PROBE = (
    "import sys\n"
    "from changewatch.pipeline.cli.command_line import main\n"
    "code = main(sys.argv[1:])\n"
    f"heavy = {sorted(HEAVY)!r}\n"
    "print(sorted(set(heavy) & {m.split('.')[0] for m in sys.modules}), file=sys.stderr)\n"
    "raise SystemExit(code)\n"
)


def info(cwd: Path, **env: str) -> tuple[list[str], list[str]]:
    """The lines `changewatch info` printed, and the heavy packages it imported."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAGSTER"))}
    done = run([sys.executable, "-c", PROBE, "info"], cwd=cwd, env=environ | env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines(), ast.literal_eval(done.stderr.strip().splitlines()[-1])


def test_info_imports_nothing_heavy(tmp_path: Path) -> None:
    lines, heavy = info(tmp_path)
    assert heavy == []
    assert lines == [
        f"watches file: {tmp_path / 'watches.yaml'} (missing)",
        "dagster instance: ephemeral (runs are not kept; set DAGSTER_HOME to keep them)  "
        f"warehouse: {tmp_path / '.changewatch' / 'warehouse.duckdb'}",
    ]


@pytest.mark.parametrize("where", ["folder", "env"])
def test_info_names_the_instance_the_runs_go_to(tmp_path: Path, where: str) -> None:
    (tmp_path / "watches.yaml").write_text("version: 1\n")
    env = {}
    if where == "folder":  # a dagster.yaml here: the commands record their runs here
        (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        home = tmp_path
    else:
        home = tmp_path / "elsewhere"
        env["DAGSTER_HOME"] = str(home)
    # A password in the URL never reaches the output; nothing is connected to.
    env["CHANGEWATCH_WAREHOUSE_URL"] = "postgresql://app:s3cret@db.invalid:5432/prod?schema=cw"
    lines, heavy = info(tmp_path, **env)
    assert heavy == []
    assert lines == [
        f"watches file: {tmp_path / 'watches.yaml'}",
        f"dagster instance: {home}  warehouse: postgresql://app@db.invalid:5432/prod?schema=cw",
    ]


def test_the_commands_name_the_instance_as_info_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`info` opens no instance; the line it prints is the one the running commands print
    from the instance they really open."""
    from changewatch.pipeline.cli.in_process_runs import instance, locations
    from changewatch.pipeline.project.storage_paths import dagster_home, locations_line

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)  # instance() sets it: undone afterwards
    expected = locations_line(dagster_home())
    with instance() as opened:
        assert locations(opened) == expected
    assert expected.startswith(f"dagster instance: {tmp_path}  warehouse: ")
