"""A change storm shows in Dagster: the sync asset's check fails until the changes are released."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from changewatch.pipeline.assets import STORM_CHECK
from changewatch.pipeline.cli import main as cli
from changewatch.pipeline.config import load_config
from changewatch.pipeline.resources import WAREHOUSE_URL_ENV
from changewatch.pipeline.wiring import build_definitions
from changewatch.sources.demo import DemoAPIServer

CONFIG = """\
version: 1
sources:
  - name: demo_issues
    type: rest
    base_url: {url}
    path: /repos/acme/widgets/issues
    params: {{state: all, per_page: 100}}
    paginator: {{type: link_header}}
    table: issues
    primary_key: number
    updated_at: updated_at
    storm: {{max_share: 0.3, min_rows: 10}}
    columns: {{number: bigint, title: text, comments: integer, updated_at: timestamp}}
"""


def check_passed(defs: dg.Definitions, instance: dg.DagsterInstance) -> bool:
    (asset,) = defs.assets  # type: ignore[misc]
    result = dg.materialize([asset], resources=defs.resources, instance=instance)
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == STORM_CHECK
    return evaluation.passed


def test_storm_fails_the_check_until_released(
    demo_api: DemoAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    path = tmp_path / "watches.yaml"
    path.write_text(CONFIG.format(url=demo_api.url))
    monkeypatch.setenv(WAREHOUSE_URL_ENV, f"duckdb:///{tmp_path / 'w.duckdb'}")
    defs = build_definitions(load_config(path))
    with dg.instance_for_test() as instance:
        assert check_passed(defs, instance)  # baseline
        demo_api.tracker.mutate(update=5)  # 12%: news
        assert check_passed(defs, instance)
        demo_api.tracker.mutate(update=20)  # 50%: a storm
        assert not check_passed(defs, instance)
        assert not check_passed(defs, instance)  # still held on the next run
        assert cli(["--config", str(path), "release", "demo_issues"]) == 0
        assert "20 held change(s) released" in capsys.readouterr().out
        assert check_passed(defs, instance)
