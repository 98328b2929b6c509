"""changewatch as a Dagster Component inside a team's own components project.

The project is scaffolded the way ``create-dagster project`` lays one out (pyproject.toml with
``[tool.dg.project]``, a root module, a ``defs`` folder), holds an asset of its own, and loads
changewatch from ``defs/changewatch/defs.yaml``. ``dagster definitions validate`` loads it in
a real code-location process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from cw_testing import REPO

DEFS_YAML = """\
type: changewatch.pipeline.definitions.dagster_component.ChangewatchComponent
attributes:
  config_path: watches.yaml
"""

OWN_ASSET = """\
import dagster as dg
import pytest


@dg.asset
def team_report() -> None:
    pass
"""

DEFINITIONS = """\
from pathlib import Path

import dagster as dg
import pytest


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""


def scaffold(root: Path, watches: str) -> Path:
    """A components project ``team_project`` under ``root`` with changewatch in its defs."""
    (root / "pyproject.toml").write_text(
        '[project]\nname = "team_project"\nversion = "0.1.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "team_project"\n'
    )
    package = root / "team_project"
    (package / "defs" / "changewatch").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "definitions.py").write_text(DEFINITIONS)
    (package / "defs" / "__init__.py").write_text("")
    (package / "defs" / "reports.py").write_text(OWN_ASSET)
    (package / "defs" / "changewatch" / "defs.yaml").write_text(DEFS_YAML)
    (package / "defs" / "changewatch" / "watches.yaml").write_text(watches)
    return package


def validate(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        DAGSTER_HOME=str(root),
        PYTHONPATH=str(root),
        CHANGEWATCH_DEMO_URL="http://127.0.0.1:9",
        CHANGEWATCH_WAREHOUSE_URL=f"duckdb:///{root / 'warehouse.duckdb'}",
    )
    (root / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate"]
        + ["-m", "team_project.definitions"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_component_joins_a_team_code_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scaffold(tmp_path, (REPO / "watches.yaml").read_text())
    done = validate(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Validation successful" in done.stdout + done.stderr

    # The same project loaded in this process: the team's asset and changewatch's side by side.
    monkeypatch.setenv("CHANGEWATCH_DEMO_URL", "http://127.0.0.1:9")
    sys.path.insert(0, str(tmp_path))
    try:
        defs = dg.load_from_defs_folder(path_within_project=tmp_path / "team_project")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.split(".")[0] == "team_project"]:
            del sys.modules[name]
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"team_report", "issues", "eval_new_bugs", "notifications"} <= keys
    assert defs.resolve_job_def("sync_sources") is not None
    assert {"warehouse", "judges"} <= set(defs.resources or {})


def test_a_bad_watches_file_fails_the_location_naming_file_and_line(tmp_path: Path) -> None:
    watches = (REPO / "watches.yaml").read_text().replace("interval:", "intervall:", 1)
    scaffold(tmp_path, watches)
    done = validate(tmp_path)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "watches.yaml:" in output and "intervall" in output, output
