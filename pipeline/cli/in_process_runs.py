"""Materialize assets from the command line, in process, recorded in the Dagster instance."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import dagster as dg
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG
from changewatch.pipeline.assets.watch_assets import (
    EVALUATION_FAILED,
    EVALUATION_TRACE,
)
from changewatch.pipeline.definitions.build_definitions import build_definitions, run_assets
from changewatch.pipeline.project.expected_errors import RunFailed
from changewatch.pipeline.project.storage_paths import (
    DAGSTER_HOME_ENV,
    dagster_home,
    locations_line,
    warehouse_location,
)
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from changewatch.pipeline.triggers.fleet_assets import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    is_fleet,
    match_partitions,
    targets_job_name,
    targets_query,
)
from changewatch.pipeline.triggers.sync_sensors import sync_job_name
from dagster._utils.error import SerializableErrorInfo

__all__ = [
    "instance",
    "locations",
    "materialize",
    "run_job",
    "source_job_assets",
    "sync_source",
    "warehouse_location",
]

# The CLI prints its own summary, warnings and errors included; Dagster's step-by-step log (a
# failed step's traceback too) stays in the run's record, where the UI shows it.
_QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def instance() -> dg.DagsterInstance:
    """The instance runs are recorded in: ``$DAGSTER_HOME``, or this folder if it holds
    the project's dagster.yaml (so ``dagster dev`` shows the runs), else an ephemeral one."""
    home = dagster_home()
    if home is None:
        return dg.DagsterInstance.ephemeral()
    os.environ[DAGSTER_HOME_ENV] = home
    return dg.DagsterInstance.get()


def locations(dagster_instance: dg.DagsterInstance) -> str:
    """One line naming the Dagster instance and the warehouse a command uses, so a run
    started outside the repository says where to look for it."""
    home = dagster_instance.root_directory if not dagster_instance.is_ephemeral else None
    return locations_line(home)


def source_job_assets(config: ChangewatchConfig, sources: Sequence[str]) -> list[str]:
    """What a sync run of ``sources`` runs, as the sensors select it: the syncs, their
    watches, delivery."""
    assets = (a for name in sources for a in run_assets(config.source(name), config))
    return list(dict.fromkeys(assets))


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
        run_config=_QUIET,
        raise_on_error=False,  # _metadata raises RunFailed, after collecting what did run
    )
    return _metadata(result)


def sync_source(
    config: ChangewatchConfig,
    source: str,
    dagster_instance: dg.DagsterInstance,
    *,
    tags: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the source's sync (sync, its watches, delivery) as the sensor would: a run of the
    sync job selecting the source's assets, so the UI lists it with the sensor's runs. A
    fleet's run, of its own job, covers every target (see ``fleet_range``)."""
    found: dict[str, dict[str, Any]] = {}
    extra: dict[str, str] = {}
    fleet = is_fleet(config.source(source))
    if fleet:
        extra, found = fleet_range(config, config.source(source), dagster_instance)
        if not extra:
            return found  # a query that gave no target: nothing to sync
    return found | run_job(
        config,
        sync_job_name(config.source(source)),
        dagster_instance,
        asset_selection=None if fleet else source_job_assets(config, [source]),
        tags={**sync_tags([source]), **extra, **(tags or {})},
    )


def fleet_range(
    config: ChangewatchConfig, source: Any, dagster_instance: dg.DagsterInstance
) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """The run tags spanning every target of fleet ``source`` (none: it has no target), and
    what a query fleet's targets job did: a list fleet's partitions are made to match the
    file first, a query fleet's targets read by its targets job
    (pipeline/triggers/fleet_assets.py)."""
    found: dict[str, dict[str, Any]] = {}
    if targets_query(source) is not None:
        found = run_job(config, targets_job_name(source), dagster_instance)
    targets = match_partitions(dagster_instance, source)
    if not targets:
        return {}, found
    return {RANGE_START_TAG: targets[0], RANGE_END_TAG: targets[-1]}, found


def run_job(
    config: ChangewatchConfig,
    job_name: str,
    dagster_instance: dg.DagsterInstance,
    *,
    partition_key: str | None = None,
    asset_selection: Sequence[str] | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run one job of the definitions in process, recorded under its own name (as its sensor
    or schedule would run it), only the named assets of it if ``asset_selection``; return
    each materialized asset's metadata values."""
    job = build_definitions(config).resolve_job_def(job_name)
    selected = [dg.AssetKey(name) for name in asset_selection] if asset_selection else None
    result = job.execute_in_process(
        instance=dagster_instance,
        partition_key=partition_key,
        asset_selection=selected,
        tags=tags or {},
        run_config=_QUIET,
        raise_on_error=False,  # _metadata raises RunFailed, after collecting what did run
    )
    return _metadata(result)


def _metadata(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    """Each materialized asset's metadata values.

    A failed step raises ``RunFailed`` with its error and the metadata of the steps that
    succeeded (the run goes on with every step that does not depend on the failed one).
    """
    found = {}
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        found[materialization.asset_key.to_user_string()] = {
            k: v.value for k, v in materialization.metadata.items()
        }
    for event in result.get_asset_observation_events():
        # A sync that found another one of its source running observes its asset instead.
        observation = event.asset_observation_data.asset_observation
        if "skipped" in observation.metadata:
            found.setdefault(
                observation.asset_key.to_user_string(),
                {k: v.value for k, v in observation.metadata.items()},
            )
    failures = result.get_step_failure_events()
    if failures:
        failure = failures[0]
        error = failure.step_failure_data.error
        raise RunFailed(
            failure.step_key or "run",
            _user_message(error) if error else "unknown error",
            results=found,
            trace=error.to_string() if error else "",
        )
    if not result.success:
        raise RunFailed(
            "run", "Dagster reports a failure (see the run in the UI)", results=found, trace=""
        )
    _raise_failed_watches(found)
    _raise_failed_targets(found)
    return found


def _raise_failed_targets(found: dict[str, dict[str, Any]]) -> None:
    """``RunFailed`` naming a fleet's targets that failed in a run that stored the others."""
    for asset, meta in found.items():
        if meta.get("targets_failed"):
            message = f"{meta['failed']}; the other targets were stored and evaluated"
            raise RunFailed(asset, message, results=found, trace="")


def _raise_failed_watches(found: dict[str, dict[str, Any]]) -> None:
    """``RunFailed`` naming every watch whose evaluation failed in a run that went on.

    A failed evaluation is recorded, not raised (see ``watch_assets._failed``), so the other
    watches and delivery still run; the run's caller must hear of it all the same.
    """
    failed = {
        asset: meta[EVALUATION_FAILED] for asset, meta in found.items() if EVALUATION_FAILED in meta
    }
    trace = "\n".join(str(found[asset].get(EVALUATION_TRACE, "")) for asset in sorted(failed))
    if len(failed) == 1:
        ((asset, message),) = failed.items()
        raise RunFailed(asset, message, results=found, trace=trace)
    if failed:
        raise RunFailed(
            ", ".join(sorted(failed)),
            "see each above; the other watches and delivery went on",
            results=found,
            trace=trace,
        )


def _user_message(error: SerializableErrorInfo) -> str:
    """The first line of the error raised in our code, beneath Dagster's wrappers."""
    while error.cls_name.startswith("Dagster") and error.cause is not None:
        error = error.cause
    # "module.Class: message" (the module is there for classes outside builtins).
    text = re.sub(rf"^[\w.]*\b{re.escape(error.cls_name)}: ?", "", error.message.strip())
    return (text.splitlines() or [error.cls_name])[0].strip() or error.cls_name


def sync_tags(sources: Sequence[str]) -> dict[str, str]:
    return {SOURCE_TAG: ",".join(sources)}
