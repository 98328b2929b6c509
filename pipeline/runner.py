"""Materialize assets from the command line, in process, recorded in the Dagster instance."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from changewatch.pipeline.assets import SOURCE_TAG
from changewatch.pipeline.config import ChangewatchConfig
from changewatch.pipeline.watch_assets import NOTIFICATIONS_ASSET, evaluation_asset_name
from changewatch.pipeline.wiring import build_definitions

__all__ = ["instance", "materialize", "source_job_assets"]


def instance() -> dg.DagsterInstance:
    """The instance runs are recorded in: ``$DAGSTER_HOME``, or this folder if it holds
    the project's dagster.yaml (so ``dagster dev`` shows the runs), else an ephemeral one."""
    if not os.environ.get("DAGSTER_HOME") and Path("dagster.yaml").is_file():
        os.environ["DAGSTER_HOME"] = str(Path.cwd())
    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.ephemeral()


def source_job_assets(config: ChangewatchConfig, sources: Sequence[str]) -> list[str]:
    """What a sync job of ``sources`` runs: the syncs, their watches, delivery."""
    names = [config.source(name).table for name in sources]
    watches = [w for w in config.watches if set(w.sources) & set(sources)]
    names += [evaluation_asset_name(w) for w in watches]
    return names + ([NOTIFICATIONS_ASSET] if watches else [])


def materialize(
    config: ChangewatchConfig,
    asset_names: Sequence[str],
    dagster_instance: dg.DagsterInstance,
    *,
    partition_key: str | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the named assets in one in-process run; return each one's metadata values."""
    defs = build_definitions(config)
    assets = [a for a in defs.assets if a.key.to_user_string() in asset_names]  # type: ignore[union-attr]
    result = dg.materialize(
        assets,
        resources=defs.resources,
        instance=dagster_instance,
        partition_key=partition_key,
        tags=tags or {},
        # The CLI prints its own summary (warnings included); Dagster's step-by-step log stays
        # in the run's record, where the UI shows it.
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
        raise_on_error=True,
    )
    found = {}
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        found[materialization.asset_key.to_user_string()] = {
            k: v.value for k, v in materialization.metadata.items()
        }
    return found


def sync_tags(sources: Sequence[str]) -> dict[str, str]:
    return {SOURCE_TAG: ",".join(sources)}
