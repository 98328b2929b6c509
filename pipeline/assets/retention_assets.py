"""Warehouse upkeep: the retention asset, its job and its daily schedule."""

# No `from __future__ import annotations` here: Dagster reads the asset function's annotations
# at definition time to recognise the context and resource parameters.

import dagster as dg
from changewatch.pipeline.project.warehouse_resource import WarehouseResource, warehouse_pool
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from changewatch.warehouse.retention import prune
from dagster import AssetExecutionContext

__all__ = ["RETENTION_ASSET", "retention_asset", "retention_schedule"]

RETENTION_ASSET = "retention"


def retention_asset(config: ChangewatchConfig, *, warehouse_url: str) -> dg.AssetsDefinition:
    """Prunes the change log, evaluations, run records and notification content by age."""
    retention = config.retention
    ages = ", ".join(
        f"{name} after {age / 86400:g} days"
        for name, age in (
            ("changes", retention.changes),
            ("sync runs", retention.sync_runs),
            ("notification content", retention.notifications),
            ("cached verdicts", retention.verdicts),
        )
        if age is not None
    )

    @dg.asset(
        name=RETENTION_ASSET,
        group_name="maintenance",
        # On PostgreSQL its own pool: it prunes in one transaction and keeps every log's newest
        # entry and whatever a watch has not read, so syncs and evaluations may run meanwhile.
        pool=warehouse_pool(warehouse_url, "retention"),
        kinds={"sql"},
        description=(
            f"Retention: forgets {ages}, keeping whatever a watch still needs, everything held, "
            "and every notification's dedupe key."
        ),
    )
    def _retention(
        context: AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        with warehouse.connect() as wh:
            stats = prune(
                wh,
                retention,
                config.sources,
                config.watches_by_source(),
                digests={d.name: list(d.watches) for d in config.digests},
            )
        context.log.info(f"retention: {stats.metadata()}")
        return dg.MaterializeResult(metadata=stats.metadata())

    return _retention


def retention_schedule(
    config: ChangewatchConfig,
) -> "tuple[dg.UnresolvedAssetJobDefinition, dg.ScheduleDefinition]":
    """The job that runs the retention asset, and its schedule on ``retention.cron`` (UTC)."""
    job = dg.define_asset_job(
        "retention_job",
        selection=dg.AssetSelection.assets(RETENTION_ASSET),
        executor_def=dg.in_process_executor,
        description="Prune the warehouse by the configured retention.",
    )
    schedule = dg.ScheduleDefinition(
        name="retention_schedule",
        cron_schedule=config.retention.cron,
        execution_timezone="UTC",
        job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Prunes the warehouse on cron '{config.retention.cron}' (UTC).",
    )
    return job, schedule
