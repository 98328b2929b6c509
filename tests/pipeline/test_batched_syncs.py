"""What a batched run's one step reports (pipeline/assets/batched_syncs.py): every sync, and
an evaluation only when it read a change or its checks' results differ from the last ones."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml
from changewatch.pipeline.assets.batched_syncs import BATCH_JOB, batch_run_config
from changewatch.pipeline.assets.watch_assets import EVALUATED_CHECK
from changewatch.pipeline.definitions.build_definitions import build_definitions
from changewatch.pipeline.project.warehouse_resource import WAREHOUSE_URL_ENV
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from cw_testing import demo_source_settings
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

COLUMNS = {"number": "bigint", "title": "text", "updated_at": "timestamp"}


def reported(result: dg.ExecuteInProcessResult) -> set[str]:
    return {
        e.asset_key.to_user_string()
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    }


def test_an_evaluation_that_read_nothing_is_reported_only_when_its_checks_say_something_new(
    tmp_path: Path, warehouse_url: str, monkeypatch
) -> None:
    one = DemoTracker(issues=4, seed=1, repo="acme/one")
    two = DemoTracker(issues=4, seed=2, repo="acme/two")
    with DemoAPIServer(one, more=[two]) as api:
        sources = [
            demo_source_settings(api.url, COLUMNS, name=n, table=n, path=f"/repos/acme/{r}/issues")
            for n, r in (("alpha", "one"), ("beta", "two"))
        ]
        config = {
            "version": 1,
            "sources": sources,
            "channels": [{"name": "out", "type": "file", "path": "notifications.jsonl"}],
            "watches": [
                {"name": f"{n}_updates", "source": n, "where": "kind = 'update'"}
                | {"channels": ["out"]}
                for n in ("alpha", "beta")
            ],
        }
        path = tmp_path / "watches.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        monkeypatch.setenv(WAREHOUSE_URL_ENV, warehouse_url)
        batch = build_definitions(load_config(path)).resolve_job_def(BATCH_JOB)
        with dg.instance_for_test() as instance:

            def run() -> set[str]:
                result = batch.execute_in_process(
                    instance=instance, run_config=batch_run_config(["alpha", "beta"])
                )
                assert result.success
                return reported(result)

            # First runs: no check of either watch has a result yet, so both are reported.
            assert run() == {"alpha", "beta", "eval_alpha_updates", "eval_beta_updates",
                             "notifications"}  # fmt: skip
            # Nothing changed: the syncs are reported, the evaluations are not.
            assert run() == {"alpha", "beta", "notifications"}
            # One source changed: its watch's evaluation read it and is reported.
            one.mutate(update=1)
            assert run() == {"alpha", "beta", "eval_alpha_updates", "notifications"}
            notified = (tmp_path / "notifications.jsonl").read_text().splitlines()
            assert len(notified) == 1

            # A failed check of beta's watch since (as a failed evaluation leaves it): the next
            # evaluation, though it reads nothing, is reported and its checks pass again.
            check = dg.AssetCheckKey(dg.AssetKey("eval_beta_updates"), EVALUATED_CHECK)
            instance.report_runless_asset_event(
                dg.AssetCheckEvaluation(
                    asset_key=check.asset_key, check_name=check.name, passed=False
                )
            )
            assert run() == {"alpha", "beta", "eval_beta_updates", "notifications"}
            latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([check])
            assert latest[check].status == AssetCheckExecutionRecordStatus.SUCCEEDED
            assert run() == {"alpha", "beta", "notifications"}
