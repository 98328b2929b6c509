"""A change storm shows in Dagster: the sync asset's check fails until the changes are released."""

from __future__ import annotations

import socket
from pathlib import Path

import dagster as dg
import pytest
from changewatch.pipeline.assets.sync_assets import STORM_CHECK
from changewatch.pipeline.cli.command_line import main as cli
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from cw_testing import PG_URL

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


def test_a_sync_whose_api_is_down_fails_its_run_not_the_storm_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    path = tmp_path / "watches.yaml"
    monkeypatch.setenv(WAREHOUSE_URL_ENV, f"duckdb:///{tmp_path / 'w.duckdb'}")
    api = DemoAPIServer(DemoTracker(issues=40, seed=7)).start()
    path.write_text(CONFIG.format(url=api.url))
    defs = build_definitions(load_config(path))
    (asset,) = defs.assets  # type: ignore[misc]

    def down() -> dg.AssetCheckEvaluation:
        """A real run of the sync against the API's loopback port, nobody listening."""
        result = dg.materialize(
            [asset], resources=defs.resources, instance=instance, raise_on_error=False
        )
        assert not result.success
        # The run's failure is the sync's own: the API refused the connection.
        [failure] = result.get_step_failure_events()
        assert failure.step_key == "issues"
        assert "127.0.0.1" in failure.step_failure_data.error.to_string()
        (evaluation,) = result.get_asset_check_evaluations()
        assert evaluation.check_name == STORM_CHECK
        return evaluation

    try:
        with dg.instance_for_test() as instance:
            assert check_passed(defs, instance)  # baseline
            api.tracker.mutate(update=20)  # 50%: a storm, held
            assert not check_passed(defs, instance)
            api.stop()
            # Down: the storm is still held, so the check still fails, for that reason.
            held = down()
            assert not held.passed and held.metadata["held_changes"].value == 20
            assert cli(["--config", str(path), "release", "demo_issues"]) == 0
            # Down, nothing held: a failed sync is no storm.
            quiet = down()
            assert quiet.passed and quiet.metadata["held_changes"].value == 0
            key = dg.AssetCheckKey(dg.AssetKey("issues"), STORM_CHECK)
            record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])
            # Its latest execution is an evaluation (passed), not one the failure cut short.
            assert (
                record[key].event.dagster_event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
            )
    finally:
        api.stop()


@pytest.mark.parametrize("warehouse", ["duckdb", "missing"])
def test_a_first_sync_whose_api_is_down_raises_no_storm_alarm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warehouse: str
) -> None:
    # "missing": a database the PostgreSQL server on loopback does not have, so not even the
    # held changes can be counted.
    url = f"duckdb:///{tmp_path / 'w.duckdb'}" if warehouse == "duckdb" else f"{PG_URL}_absent"
    monkeypatch.setenv(WAREHOUSE_URL_ENV, url)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        path = tmp_path / "watches.yaml"
        path.write_text(CONFIG.format(url=f"http://127.0.0.1:{sock.getsockname()[1]}"))
        defs = build_definitions(load_config(path))
        (asset,) = defs.assets  # type: ignore[misc]
        with dg.instance_for_test() as instance:
            result = dg.materialize(
                [asset], resources=defs.resources, instance=instance, raise_on_error=False
            )
    assert not result.success and len(result.get_step_failure_events()) == 1
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.passed
    if warehouse == "duckdb":
        assert evaluation.metadata["held_changes"].value == 0
    else:
        assert evaluation.metadata["evaluated"].value is False
        assert evaluation.description.startswith("not evaluated: the sync failed")
