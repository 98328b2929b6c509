"""Builds Dagster definitions (assets, jobs, sensor, schedules, resources) from a watches file."""

from __future__ import annotations

import os

import dagster as dg

from pipeline.assets import SOURCE_TAG, sync_asset
from pipeline.config import WatchConfig
from pipeline.resources import warehouse_resource
from pipeline.sensors import cron_schedule, sync_job_name, sync_sensor

__all__ = ["build_definitions"]


def build_definitions(
    config: WatchConfig, *, environ: dict[str, str] | None = None
) -> dg.Definitions:
    """Assets, jobs, the sync sensor, cron schedules and resources for ``config``."""
    environ = dict(os.environ) if environ is None else environ
    assets = [sync_asset(source) for source in config.sources]
    jobs = {
        source.name: dg.define_asset_job(
            sync_job_name(source),
            selection=dg.AssetSelection.assets(source.table),
            tags={SOURCE_TAG: source.name},
            # Steps run inside the run's process: one process holds the DuckDB file at a time.
            executor_def=dg.in_process_executor,
            description=f"Sync source {source.name} into table {source.table}.",
        )
        for source in config.sources
    }
    interval_sources = [s for s in config.sources if s.cron is None]
    sensors = (
        [sync_sensor(interval_sources, [jobs[s.name] for s in interval_sources])]
        if interval_sources
        else []
    )
    schedules = [cron_schedule(s, jobs[s.name]) for s in config.sources if s.cron is not None]
    return dg.Definitions(
        assets=assets,
        jobs=list(jobs.values()),
        sensors=sensors,
        schedules=schedules,
        resources={"warehouse": warehouse_resource(environ)},
        executor=dg.in_process_executor,
    )
