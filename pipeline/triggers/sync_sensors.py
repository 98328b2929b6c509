"""Time-based triggers: a sensor for interval sources and a schedule for each cron source.

Neither opens the warehouse (a DuckDB file being written cannot even be read by another
process): the schedules decide from the clock alone, the sensor from the clock and cheap
change probes whose state it keeps in its cursor; run keys make each decision run once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg
from changewatch.pipeline.assets.batched_syncs import batch_run_config, split_batch
from changewatch.pipeline.assets.sync_assets import FULL_TAG, SOURCE_TAG
from changewatch.pipeline.polling.adaptive_envelope import spoken
from changewatch.pipeline.polling.poll_schedule import (
    POLL_TAG,
    merged_tag,
    schedule_run,
    schedule_tag,
)
from changewatch.pipeline.polling.poll_slots import due_slot, jitter_offset
from changewatch.pipeline.polling.probe_decisions import Decision, decide, due_probes, probe_states
from changewatch.pipeline.polling.source_pauses import pause, paused_reasons
from changewatch.pipeline.polling.sync_triggers import DEMO_API_URL, is_demo_source
from changewatch.pipeline.project.watches_file import DEFAULT_BATCH_MAX, DEFAULT_TICK
from changewatch.pipeline.triggers.queued_syncs import queued_sources
from changewatch.sources import SourceConfig
from changewatch.sources.fleet import is_fleet
from changewatch.sources.probe import ProbeClients, probe_all, probe_budget

__all__ = [
    "BATCH_TAG",
    "DEBOUNCE_SCHEDULE",
    "DEMO_SENSOR",
    "SYNC_JOB",
    "SYNC_SENSOR",
    "TRIGGER_TAG",
    "cron_schedule",
    "debounce_cron",
    "debounce_schedule",
    "demo_sensor",
    "is_demo_source",
    "sweep_schedule",
    "sync_job_name",
    "sync_request",
    "sync_sensor",
]

SYNC_SENSOR = "sync_due_sources"
# The job that syncs plain sources, each run selecting its sources' assets.
SYNC_JOB = "sync_sources"
# Why the sensor requested a run: probe (a change), reconcile, or interval.
TRIGGER_TAG = "changewatch/trigger"
# How many sources a batched run syncs.
BATCH_TAG = "changewatch/batch_size"
DEBOUNCE_SCHEDULE = "deliver_debounced"
DEMO_SENSOR = "sync_demo_api"


def sync_job_name(source: SourceConfig) -> str:
    """The job a sync of ``source`` runs: the one job of all plain sources (each run selects
    its sources' assets), or a fleet's own (its runs name partitions)."""
    return f"sync_{source.name}" if is_fleet(source) else SYNC_JOB


def sync_request(
    source: str,
    selection: Sequence[dg.AssetKey],
    *,
    run_key: str | None,
    tags: dict[str, str],
    job_name: str = SYNC_JOB,
) -> dg.RunRequest:
    """A run of the sync job doing one plain source: its sync, watches and delivery."""
    return dg.RunRequest(
        run_key=run_key,
        job_name=job_name,
        asset_selection=list(selection),
        # One run of a source at a time: deploy/dagster.yaml limits runs per this tag.
        tags={SOURCE_TAG: source, **tags},
    )


def sync_sensor(
    sources: list[SourceConfig],
    job: dg.UnresolvedAssetJobDefinition,
    selections: Mapping[str, list[dg.AssetKey]],
    *,
    clock: Callable[[], float] = time.time,
    name: str = SYNC_SENSOR,
    running: bool = True,
    description: str = (
        "Probes each interval source once per interval (plus jitter) and requests a sync when "
        "it changed, its probe failed, or its probe.reconcile time has passed."
    ),
    clients: ProbeClients | None = None,
    batch: bool = True,
    schedule_job: dg.UnresolvedAssetJobDefinition | None = None,
    batch_job: dg.JobDefinition | None = None,
    tick: float = DEFAULT_TICK,
    batch_max: int = DEFAULT_BATCH_MAX,
) -> dg.SensorDefinition:
    """One sensor over interval sources: when a source's slot begins, a cheap probe asks
    whether it changed (sources/probe.py), and a sync is requested only if so (the rules and
    run keys are in pipeline/polling/probe_decisions.py). A source with ``probe: false`` is synced
    at every slot, with run key ``<source>:<slot>``.

    Dagster drops a request whose key already ran, so ticks, restarts and daemon hiccups never
    double a sync. A missed slot is not replayed: the next slot's sync fetches from the stored
    cursor anyway. Probe state lives in the sensor's cursor (never the warehouse, which a
    running sync may hold); ``clients`` keeps connections across ticks, made at the first.

    Each run is of ``job``, selecting its sources' assets (``selections``: each source's sync,
    watches and delivery); several syncs due at one tick become one run, so a run's start-up
    (some 5 core-seconds) is paid once per tick; its run key is a hash of theirs. With
    ``batch=False`` each sync is a run of its own, keyed by its decision.

    Sources with ``min_interval``/``max_interval`` are probed when their adaptive envelope says
    (pipeline/polling/adaptive_envelope.py). A source that meets a stop condition is paused in the
    Dagster instance (pipeline/polling/source_pauses.py) and gets no probe and no run until resumed.
    Each run carries its sources' schedules in ``POLL_TAG``, which the run writes to
    ``poll_schedule``; a pause or resume is recorded there by a run of ``schedule_job``. ``tick``:
    the least seconds between two evaluations (the watches file's ``polling: tick``).

    A plain source due while a queued run that has not begun already names it is not asked
    again (pipeline/triggers/queued_syncs.py): that run syncs it, and the queue stays as long
    as the workers are behind, not longer at every tick.
    """
    pool: list[ProbeClients] = [clients] if clients is not None else []
    stopping = [s.name for s in sources if s.stop.active]
    adaptive = {s.name for s in sources if s.min_interval is not None}
    tables = {s.name: s.table for s in sources}
    extra = [schedule_job] if schedule_job is not None else []
    extra += [batch_job] if batch_job is not None else []

    @dg.sensor(
        name=name,
        jobs=[job, *extra],
        minimum_interval_seconds=round(tick),
        default_status=(
            dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED
        ),
        description=description,
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        now = clock()
        if not pool:
            pool.append(ProbeClients())  # in the code server, kept for its lifetime
        # Pauses live in the instance (never the warehouse); one query for them all.
        paused = paused_reasons(context.instance, "source", stopping) if stopping else {}
        due = due_probes(sources, context.cursor, now, paused)
        results = probe_all(due, probe_states(context.cursor), pool[0], budget=probe_budget())
        decision = decide(sources, context.cursor, results, now, paused)
        for error in decision.errors.values():
            context.log.warning("probe failed: %s", error)
        _log_changes(context, decision, [n for n in results if n in adaptive], now)
        for source_name, reason in decision.pauses.items():
            asset = dg.AssetKey(tables[source_name])
            pause(context.instance, "source", source_name, reason, asset=asset, now=now)
        by_name = {source.name: source for source in sources}
        # A plain source already in a queued run gets no second one (its run syncs it when it
        # begins); a fleet's runs name partitions, so its requests always go.
        plain = [r.source for r in decision.requests if not is_fleet(by_name[r.source])]
        waiting = queued_sources(context.instance, plain)
        if waiting:
            names = sorted(waiting)
            more = f" and {len(names) - 10} more" if len(names) > 10 else ""
            listed = ", ".join(names[:10])
            context.log.info(f"due, and in a queued run that will sync them: {listed}{more}")
        requests = []
        for request in decision.requests:
            if request.source in waiting:
                continue
            source = by_name[request.source]
            slot = due_slot(now, source.interval, jitter_offset(source.name, source.jitter))
            requests.append(
                sync_request(
                    source.name,
                    selections[source.name],
                    job_name=job.name,
                    run_key=request.run_key,
                    tags={
                        "changewatch/slot": str(slot),
                        TRIGGER_TAG: request.reason,
                        POLL_TAG: schedule_tag(decision.schedules, [source.name], now),
                    },
                )
            )
        if batch and len(requests) > 1:
            requests = [
                _batched(batch_job, job.name, chunk, selections) if len(chunk) > 1 else chunk[0]
                for chunk in split_batch(requests, batch_max, lambda r: r.tags[SOURCE_TAG])
            ]
        changed = [*decision.pauses, *decision.resumed]
        if schedule_job is not None and changed:
            requests.append(schedule_run(schedule_tag(decision.schedules, changed, now)))
        return dg.SensorResult(run_requests=requests, cursor=decision.cursor)

    return _sensor


def _log_changes(
    context: dg.SensorEvaluationContext, decision: Decision, probed: list[str], now: float
) -> None:
    """The tick log (the UI's record of the sensor): pauses, resumes, and when each source
    in ``probed`` (those with an envelope; the others' next probe is their next slot) is
    probed next and why."""
    for name, reason in decision.pauses.items():
        context.log.warning(f"{name}: paused: {reason}; `changewatch resume {name}` resumes it")
    for name in decision.resumed:
        context.log.info(f"{name}: resumed")
    for name in probed:
        schedule = decision.schedules.get(name)
        if schedule is not None and schedule.next_due is not None:
            wait = spoken(max(0.0, schedule.next_due - now))
            context.log.info(f"{name}: next probe in {wait}: {schedule.reason}")


def _batched(
    batch_job: dg.JobDefinition | None,
    job_name: str,
    requests: list[dg.RunRequest],
    selections: Mapping[str, list[dg.AssetKey]],
) -> dg.RunRequest:
    """One run doing the syncs of ``requests``: of ``batch_job`` (one step,
    pipeline/assets/batched_syncs.py) naming their sources, or without one of ``job_name``
    selecting their sources' assets."""
    names = sorted(r.tags[SOURCE_TAG] for r in requests)
    keys = "\n".join(sorted(r.run_key or "" for r in requests))
    schedules = merged_tag(r.tags[POLL_TAG] for r in requests)
    target = (
        {"job_name": batch_job.name, "run_config": batch_run_config(names, schedules)}
        if batch_job is not None
        else {
            "job_name": job_name,
            "asset_selection": list(dict.fromkeys(k for n in names for k in selections[n])),
        }
    )
    return dg.RunRequest(
        # From the syncs' own keys: the same tick evaluated again asks the same run.
        run_key=f"batch:{hashlib.sha256(keys.encode()).hexdigest()[:16]}",
        **target,
        tags={
            TRIGGER_TAG: "batch",
            BATCH_TAG: str(len(names)),
            # With the batch job, in its config instead (pipeline/assets/batched_syncs.py).
            **({POLL_TAG: schedules} if batch_job is None else {}),
        },
    )


def demo_sensor(
    sources: list[SourceConfig],
    job: dg.UnresolvedAssetJobDefinition,
    selections: Mapping[str, list[dg.AssetKey]],
    **options: Any,
) -> dg.SensorDefinition:
    """The sensor of the sources on the demo API: stopped until someone serves the API, so
    ``dagster dev`` after ``changewatch demo`` (whose API is gone) starts no failing runs."""
    return sync_sensor(
        sources,
        job,
        selections,
        **options,
        name=DEMO_SENSOR,
        running=False,
        description=(
            f"Syncs the sources on the demo API at {DEMO_API_URL}; stopped by default because "
            "nothing serves it after `changewatch demo` ends. Run `changewatch demo-api`, "
            "then start this sensor."
        ),
    )


def cron_schedule(
    source: SourceConfig,
    job: dg.UnresolvedAssetJobDefinition,
    selection: Sequence[dg.AssetKey],
) -> dg.ScheduleDefinition:
    """A schedule for a source declared with ``cron`` instead of an interval; ``selection``
    is what its runs of ``job`` do (its sync, watches and delivery)."""
    assert source.cron is not None
    return _source_schedule(
        source,
        job,
        selection,
        name=f"sync_{source.name}_schedule",
        cron=source.cron,
        description=f"Syncs {source.name} on cron '{source.cron}' ({source.timezone}).",
    )


def sweep_schedule(
    source: SourceConfig,
    job: dg.UnresolvedAssetJobDefinition,
    selection: Sequence[dg.AssetKey],
) -> dg.ScheduleDefinition:
    """The reconciliation sweep of a source: its sync run, walking the complete listing."""
    assert source.reconcile is not None
    return _source_schedule(
        source,
        job,
        selection,
        name=f"sweep_{source.name}_schedule",
        cron=source.reconcile,
        extra_tags={FULL_TAG: "true"},
        description=(
            f"Full walk of {source.name} on cron '{source.reconcile}': objects that vanished "
            "upstream become delete changes."
        ),
    )


def _source_schedule(
    source: SourceConfig,
    job: dg.UnresolvedAssetJobDefinition,
    selection: Sequence[dg.AssetKey],
    *,
    name: str,
    cron: str,
    description: str,
    extra_tags: dict[str, str] | None = None,
) -> dg.ScheduleDefinition:
    tags = {SOURCE_TAG: source.name, **(extra_tags or {})}
    # A fleet's job is its own: its runs do all of it.
    selected = None if is_fleet(source) else list(selection)

    @dg.schedule(
        name=name,
        cron_schedule=cron,
        execution_timezone=source.timezone,
        job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=description,
    )
    def _schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        return dg.RunRequest(asset_selection=selected, tags=tags)

    return _schedule


def debounce_cron(debounces: list[float]) -> str:
    """How often debounced notifications are settled and sent: a few times per shortest window.

    Every half of the shortest debounce, in whole minutes from 1 to 15: a notification goes
    out at most that late after its window, whatever the sources' intervals.

    >>> debounce_cron([600.0, 3600.0]), debounce_cron([30.0]), debounce_cron([86400.0])
    ('*/5 * * * *', '* * * * *', '*/15 * * * *')
    """
    step = max(1, min(15, int(min(debounces) // 120)))
    return "* * * * *" if step == 1 else f"*/{step} * * * *"


def debounce_schedule(
    debounces: list[float], job: dg.UnresolvedAssetJobDefinition
) -> dg.ScheduleDefinition:
    """Runs delivery on a clock while watches debounce, since syncs may come rarely.

    From the clock alone, like the sensors: a schedule never opens the warehouse (a DuckDB
    file admits one process), so it cannot ask whether anything waits; a pass with nothing
    due settles and sends nothing.
    """
    cron = debounce_cron(debounces)
    return dg.ScheduleDefinition(
        name=DEBOUNCE_SCHEDULE,
        cron_schedule=cron,
        job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=(
            f"Settles debounced notifications whose window has ended and delivers them, on "
            f"cron '{cron}' (UTC): they go out after their window even if no sync runs."
        ),
    )
