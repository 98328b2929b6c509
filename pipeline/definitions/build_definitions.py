"""Builds Dagster definitions (assets, jobs, sensor, schedules, resources) from a watches file."""

from __future__ import annotations

import os
from datetime import timedelta

import dagster as dg
from changewatch.pipeline.assets.batched_syncs import batched_sync_job
from changewatch.pipeline.assets.learned_assets import learned_assets, learned_schedules
from changewatch.pipeline.assets.retention_assets import (
    retention_asset,
    retention_schedule,
)
from changewatch.pipeline.assets.sync_assets import SOURCE_TAG, sync_asset
from changewatch.pipeline.assets.watch_assets import (
    NOTIFICATIONS_ASSET,
    digest_asset,
    evaluation_asset,
    evaluation_asset_name,
    notifications_asset,
)
from changewatch.pipeline.definitions.threaded_executor import (
    threaded_executor,
    threads_from_env,
)
from changewatch.pipeline.polling.poll_schedule import poll_schedule_asset, poll_schedule_job
from changewatch.pipeline.project.warehouse_resource import (
    WAREHOUSE_POOL,
    JudgeResource,
    warehouse_pool,
    warehouse_resource,
    warehouse_url,
)
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from changewatch.pipeline.triggers.fleet_assets import (
    fleet_assets,
    fleet_jobs,
    fleet_run_assets,
    fleet_sensor,
    is_fleet,
)
from changewatch.pipeline.triggers.sync_sensors import (
    SYNC_JOB,
    cron_schedule,
    debounce_schedule,
    demo_sensor,
    is_demo_source,
    sweep_schedule,
    sync_job_name,
    sync_sensor,
)
from changewatch.pipeline.triggers.webhook_sensor import reconciling, webhook_sensor

__all__ = [
    "DELIVER_JOB",
    "SYNC_JOB",
    "build_definitions",
    "digest_job_name",
    "run_assets",
    "run_selections",
]

DELIVER_JOB = "deliver_notifications"


def digest_job_name(name: str) -> str:
    """The job that sends digest ``name``: its schedule's and `changewatch digest`'s runs."""
    return f"digest_{name}_job"


def build_definitions(
    config: ChangewatchConfig, *, environ: dict[str, str] | None = None
) -> dg.Definitions:
    """Assets, jobs, the sync sensor, schedules and resources for ``config``.

    Lineage: each source's sync asset feeds the evaluation assets of the watches over it,
    which feed the ``notifications`` (delivery) asset, which feeds each digest.
    """
    environ = dict(os.environ) if environ is None else environ
    # The backend decides the pools: one for everything on DuckDB, one per asset on PostgreSQL.
    url = warehouse_url(environ)
    if any(source.webhook for source in config.sources):
        # Sources with webhooks are polled only to reconcile, more slowly (webhook_sensor.py).
        config = config.model_copy(update={"sources": [reconciling(s) for s in config.sources]})
    assets = [sync_asset(s, warehouse_url=url) for s in config.sources if not is_fleet(s)]
    # A fleet: one asset partitioned by target (pipeline/triggers/fleet_assets.py).
    assets += [a for s in config.sources if is_fleet(s) for a in fleet_assets(s, warehouse_url=url)]
    assets += [evaluation_asset(watch, config, warehouse_url=url) for watch in config.watches]
    if config.watches:
        assets.append(notifications_asset(config, warehouse_url=url))
    digests = {
        digest.name: digest_asset(digest, config, warehouse_url=url) for digest in config.digests
    }
    assets += list(digests.values())

    selections = {source.name: run_assets(source, config) for source in config.sources}
    fleets = [s for s in config.sources if is_fleet(s)]
    plain = [s for s in config.sources if not is_fleet(s)]
    # One job syncs every plain source, each run selecting its sources' assets: a job per
    # source would copy the delivery asset's inputs (every watch) into each, so resolving
    # them at the code server's start grew with sources squared (bench/bench_definitions.py).
    sync_job = _sync_job(plain, selections, _sync_executor(url, environ)) if plain else None
    # A fleet's runs name partitions of its own: it keeps a job of its own.
    jobs = {s.name: sync_job for s in plain} | {s.name: _fleet_job(s, selections) for s in fleets}
    digest_jobs = [
        dg.define_asset_job(
            digest_job_name(name),
            selection=dg.AssetSelection.assets(asset.key),
            executor_def=dg.in_process_executor,
            description=f"Send the {name} digest of one day.",
        )
        for name, asset in digests.items()
    ]
    interval_sources = [s for s in plain if s.cron is None]
    live = [s for s in interval_sources if not is_demo_source(s)]
    demo = [s for s in interval_sources if is_demo_source(s)]
    keys = {name: [dg.AssetKey(a) for a in assets] for name, assets in selections.items()}
    # Pauses and resumes leave no sync to record them: a small run of their own does.
    schedule_job = poll_schedule_job() if any(s.stop.active for s in interval_sources) else None
    if schedule_job is not None:
        assets.append(poll_schedule_asset(warehouse_url=url))

    tick = config.polling.tick
    resources = {"warehouse": warehouse_resource(environ), "judges": JudgeResource()}
    recorded = {"schedule_job": schedule_job} if schedule_job is not None else {}
    hooked = [s for s in config.sources if s.webhook is not None]
    # Several sources due (or with webhook deliveries) at one tick: one run of one step
    # (pipeline/assets/batched_syncs.py).
    batch_job = (
        batched_sync_job(
            config, warehouse_url=url, threads=_threads(url, environ), resources=resources
        )
        if interval_sources or any(not is_fleet(s) for s in hooked)
        else None
    )
    if batch_job is not None:
        recorded["batch_job"] = batch_job
    batch_max = recorded["batch_max"] = config.polling.batch_max
    sensors = [sync_sensor(live, sync_job, keys, tick=tick, **recorded)] if live else []
    sensors += [demo_sensor(demo, sync_job, keys, tick=tick, **recorded)] if demo else []
    fleet_only = [j for s in fleets for j in fleet_jobs(s)]
    if fleets:
        fleet_run_jobs = [jobs[s.name] for s in fleets] + fleet_only
        sensors.append(fleet_sensor(fleets, fleet_run_jobs, tick=tick))
    if hooked:
        sensors.append(webhook_sensor(hooked, jobs, keys, batch_job=batch_job, batch_max=batch_max))
    schedules = [
        cron_schedule(s, jobs[s.name], keys[s.name]) for s in config.sources if s.cron is not None
    ]
    schedules += [
        sweep_schedule(s, jobs[s.name], keys[s.name]) for s in config.sources if s.reconcile
    ]
    schedules += [
        _digest_schedule(digest, job)
        for digest, job in zip(config.digests, digest_jobs, strict=True)
    ]
    delivery_jobs = []
    debounces = [w.debounce for w in config.watches if w.debounce]
    if debounces:
        deliver_job = dg.define_asset_job(
            DELIVER_JOB,
            selection=dg.AssetSelection.assets(NOTIFICATIONS_ASSET),
            executor_def=dg.in_process_executor,
            description="Settle debounced notifications whose window has ended, and deliver.",
        )
        delivery_jobs.append(deliver_job)
        schedules.append(debounce_schedule(debounces, deliver_job))
    # Only watches with a learned judge stage get one: the asset graph of others is unchanged.
    assets += learned_assets(config, warehouse_url=url)
    maintenance_jobs, learning = learned_schedules(config)
    schedules += learning
    if config.retention.enabled:
        assets.append(retention_asset(config, warehouse_url=url))
        retention_job, schedule = retention_schedule(config)
        maintenance_jobs.append(retention_job)
        schedules.append(schedule)
    return dg.Definitions(
        assets=assets,
        jobs=list({job.name: job for job in jobs.values()}.values())
        + ([batch_job] if batch_job is not None else [])
        + fleet_only
        + ([schedule_job] if schedule_job is not None else [])
        + digest_jobs
        + delivery_jobs
        + maintenance_jobs,
        sensors=sensors,
        schedules=schedules,
        resources=resources,
        executor=dg.in_process_executor,
    )


def run_selections(config: ChangewatchConfig) -> dict[str, list[dg.AssetKey]]:
    """What a sync run of each source selects, by source name (its sync, watches, delivery)."""
    return {s.name: [dg.AssetKey(a) for a in run_assets(s, config)] for s in config.sources}


def run_assets(source, config: ChangewatchConfig) -> list[str]:
    """What a sync of ``source`` runs: its sync asset, its watches' evaluations, delivery."""
    evaluations = [evaluation_asset_name(w) for w in config.watches if source.name in w.sources]
    # A query fleet reads its targets first (pipeline/triggers/fleet_assets.py).
    selected = [*fleet_run_assets(source), source.table, *evaluations]
    return selected + [NOTIFICATIONS_ASSET] if evaluations else selected


def _sync_job(
    sources, selections: dict[str, list[str]], executor: dg.ExecutorDefinition
) -> dg.UnresolvedAssetJobDefinition:
    """The job that syncs plain sources: each run selects the assets of the sources it syncs
    (its sync, its watches' evaluations, delivery), one source or all due at a sensor tick,
    so a run's start-up is paid once per tick."""
    assets = dict.fromkeys(a for s in sources for a in selections[s.name])
    return dg.define_asset_job(
        SYNC_JOB,
        selection=dg.AssetSelection.assets(*assets),
        executor_def=executor,
        description=(
            "Sync sources, evaluate their watches and deliver; each run selects its sources "
            "(the run's changewatch/source tag names them)."
        ),
    )


def _fleet_job(source, selections: dict[str, list[str]]) -> dg.UnresolvedAssetJobDefinition:
    """A fleet's job: its partitioned sync (a run names a range of targets), its watches,
    delivery."""
    selected = selections[source.name]
    return dg.define_asset_job(
        sync_job_name(source),
        selection=dg.AssetSelection.assets(*selected),
        tags={SOURCE_TAG: source.name},
        # Steps run inside the run's process: one process holds the DuckDB file at a time.
        executor_def=dg.in_process_executor,
        description=f"Sync fleet {source.name} into table {source.table}"
        + (", evaluate its watches and deliver." if len(selected) > 1 else "."),
    )


def _sync_executor(url: str, environ: dict[str, str]) -> dg.ExecutorDefinition:
    """How a sync run (of one source or several) executes its steps, all inside its process.

    On PostgreSQL, which takes many writers, up to CHANGEWATCH_SYNC_CONCURRENCY (4) at once on
    threads, so one slow API does not hold the others; on DuckDB one after another, since a
    DuckDB file admits one writer (its one-slot pool would serialize them anyway).
    """
    if warehouse_pool(url, "batch") == WAREHOUSE_POOL:
        return dg.in_process_executor
    return threaded_executor.configured({"max_concurrent": threads_from_env(environ)})


def _threads(url: str, environ: dict[str, str]) -> int:
    """Syncs at once in a batched run's step: one on DuckDB, else CHANGEWATCH_SYNC_CONCURRENCY."""
    return 1 if warehouse_pool(url, "batch") == WAREHOUSE_POOL else threads_from_env(environ)


def _digest_schedule(digest, job: dg.UnresolvedAssetJobDefinition) -> dg.ScheduleDefinition:
    """At the digest's cron time, send the digest of the day before (in its timezone)."""

    @dg.schedule(
        name=f"digest_{digest.name}_schedule",
        cron_schedule=digest.cron,
        execution_timezone=digest.timezone,
        job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Sends the {digest.name} digest on cron '{digest.cron}' ({digest.timezone}).",
    )
    def _schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        day = (context.scheduled_execution_time - timedelta(days=1)).date().isoformat()
        # The partition is the run key: the daemon requests each day's digest once.
        return dg.RunRequest(run_key=f"{digest.name}:{day}", partition_key=day)

    return _schedule
