"""The learned stage's training asset shows in Dagster and trains from the examples file."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml
from changewatch.evaluators import learned
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.storage_paths import CONFIG_ENV
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from cw_testing import demo_source_settings
from test_learned_stage import CONDITION, _examples


def test_the_training_asset_retrains_from_the_watch_s_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(learned.DIR_ENV, str(tmp_path / "learned"))
    monkeypatch.setenv(WAREHOUSE_URL_ENV, f"duckdb:///{tmp_path / 'wh.duckdb'}")
    watch = {
        "name": "drops",
        "source": "demo_issues",
        "judge": [
            {"condition": CONDITION, "model": "learned"},
            {"model": "m", "base_url": "http://127.0.0.1:9/v1", "when": "unsure"},
        ],
    }
    path = tmp_path / "watches.yaml"
    source = demo_source_settings(
        "http://127.0.0.1:9", {"number": "bigint", "updated_at": "timestamp"}
    )
    path.write_text(yaml.safe_dump({"sources": [source], "watches": [watch]}))
    monkeypatch.setenv(CONFIG_ENV, str(path))
    (tmp_path / "evals").mkdir()
    examples = [e.model_dump(mode="json", exclude_none=True) for e in _examples(30)]
    (tmp_path / "evals" / "drops.yaml").write_text(yaml.safe_dump({"examples": examples}))

    config = load_config(path)
    defs = build_definitions(config)
    [asset] = [a for a in defs.assets if a.key.to_user_string() == "learned_drops"]  # type: ignore[union-attr]
    with dg.instance_for_test() as instance:
        result = dg.materialize([asset], resources=defs.resources, instance=instance)
    [event] = result.get_asset_materialization_events()
    outcome = event.step_materialization_data.materialization.metadata["outcome"].value
    assert outcome.startswith("train drops: 30 labels (30 from people, 0 from the served judge)")
    assert ": now in use, learned@" in outcome
    assert learned.model_file(config.watch("drops").judge.judges()[0]).is_file()
