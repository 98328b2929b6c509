"""A batched run's one step: the syncs, evaluations and delivery of every source due at a tick.

When several sources are due at one sensor tick, the sensor asks one run of the ``sync_batch``
job (pipeline/triggers/sync_sensors.py), whose config names them. Its one step does what the
asset steps of those sources would do (the same bodies: ``sync_events``, ``evaluation_result``,
``delivery_result``) and reports each asset's materialization and check results against the
same asset keys, so each asset's history, lineage and checks in the UI are as before, with
one exception: an evaluation that read no change, and whose checks passed last time as they
do now, is not reported again (``_settled``); its asset's last materialization is the last
evaluation that read something.

Why one step rather than the asset job's steps: in a batched run Dagster's bookkeeping cost
about twice the work itself, per changed source (bench/bench_batch_cost.py): each asset and
check of the selection wrote a planned event and a step output besides its materialization
or evaluation, each asset a step start and success, and each step read its parents' records
for data versions. Here a changed source writes its materialization and its checks' results,
nothing else. A run of one source (a run per poll, a cron or sweep, the UI, the CLI) stays a
run of the asset job.

On PostgreSQL the syncs run up to ``CHANGEWATCH_SYNC_CONCURRENCY`` (4) at once on threads, then
the evaluations likewise, as the asset job's threaded executor ran them; on DuckDB one after
another, in the one-slot ``warehouse`` pool (a DuckDB file admits one writing process). A
source whose sync fails or skips does not stop the others: its checks are reported, the
watches over it wait for the next run (their changes stay unread), and the step fails at the
end with one line per failed source, as the asset job's run failed with its failed steps.

The step's jobs hand their warehouse connections on to each other (warehouse/connection_pool.py):
on PostgreSQL a changed source no longer opens a session for its sync and another for its
evaluation, each a server process started and warmed, as its own asset steps did.
"""

# No `from __future__ import annotations` here: Dagster reads the op function's annotations
# at definition time to recognise the context, config and resource parameters.

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

import dagster as dg
from changewatch.pipeline.assets.sync_assets import sync_events
from changewatch.pipeline.assets.watch_assets import (
    NOTIFICATIONS_ASSET,
    delivery_result,
    evaluation_asset_name,
    evaluation_result,
    first_line,
)
from changewatch.pipeline.polling.poll_schedule import POLL_TAG
from changewatch.pipeline.project.expected_errors import redact
from changewatch.pipeline.project.warehouse_resource import (
    WAREHOUSE_POOL,
    JudgeResource,
    WarehouseResource,
    warehouse_pool,
)
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from changewatch.warehouse.connection_pool import ConnectionPool
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

__all__ = [
    "BATCH_JOB",
    "BATCH_OP",
    "batch_run_config",
    "batch_sources",
    "batched_sync_job",
    "split_batch",
]

T = TypeVar("T")

BATCH_JOB = "sync_batch"
BATCH_OP = "sync_evaluate_deliver"  # not the job's name: Dagster refuses an op named as its job


def batch_run_config(sources: Iterable[str], poll_schedule: str = "") -> dict:
    """The run config of a batched run of ``sources``, with the sensor's schedule of each
    (``poll_schedule``, the rows pipeline/polling/poll_schedule.py writes)."""
    config = {"sources": sorted(sources), "poll_schedule": poll_schedule}
    return {"ops": {BATCH_OP: {"config": config}}}


def batch_sources(run_config: Mapping) -> list[str]:
    """The sources a batched run's config names (none for another job's config).

    >>> batch_sources(batch_run_config(["b", "a"])), batch_sources({})
    (['a', 'b'], [])
    """
    return list(run_config.get("ops", {}).get(BATCH_OP, {}).get("config", {}).get("sources", []))


def split_batch(items: Sequence[T], size: int, source: Callable[[T], str]) -> list[list[T]]:
    """``items`` (one per source, named by ``source``) in runs of at most ``size``, as even
    as can be, in the order of their sources' names: a tick evaluated again makes the same
    runs, and so the same run keys (the watches file's ``polling: batch_max``).

    >>> split_batch(list("edcba"), 2, str), split_batch(list("abcd"), 3, str)
    ([['a'], ['b', 'c'], ['d', 'e']], [['a', 'b'], ['c', 'd']])
    """
    ordered = sorted(items, key=source)
    runs = -(-len(ordered) // size)
    return [ordered[i * len(ordered) // runs : (i + 1) * len(ordered) // runs] for i in range(runs)]


class BatchConfig(dg.Config):
    sources: list[str]
    # In the run config, not a run tag as a run of one source has it: Dagster indexes run
    # tags in PostgreSQL, and the rows of a few hundred sources (4,624 bytes at 300) passed
    # the index's 2,704-byte limit, failing the sensor's tick (bench/README.md, hosts).
    poll_schedule: str = ""


def batched_sync_job(
    config: ChangewatchConfig, *, warehouse_url: str, threads: int, resources: dict
) -> dg.JobDefinition:
    """The job of batched runs over the plain sources of ``config``, with the code location's
    ``resources`` bound (a job Definitions had to bind them to makes Dagster copy the sensors
    that target it, with a warning about a beta parameter on every load)."""
    duckdb = warehouse_pool(warehouse_url, "batch") == WAREHOUSE_POOL
    workers = 1 if duckdb else threads
    watches_file = config  # the op's own parameter `config` is its run config
    by_name = {s.name: s for s in config.sources}

    @dg.op(
        name=BATCH_OP,
        out={},
        # DuckDB: the one-slot pool every warehouse writer shares. PostgreSQL: no pool; the
        # database's sync and evaluation locks keep runs that share a source correct.
        pool=WAREHOUSE_POOL if duckdb else None,
        description="Syncs the run's sources, evaluates their watches and delivers.",
    )
    def _batch(
        context: dg.OpExecutionContext,
        config: BatchConfig,
        warehouse: WarehouseResource,
        judges: JudgeResource,
    ) -> Iterator:
        unknown = sorted(set(config.sources) - set(by_name))
        if unknown:
            raise dg.Failure(f"not plain sources of the watches file: {', '.join(unknown)}")
        polled = {POLL_TAG: config.poll_schedule}
        failed: dict[str, str] = {}
        synced: set[str] = set()
        with (
            _PooledWarehouse(warehouse, workers) as warehouse,
            ThreadPoolExecutor(workers, thread_name_prefix="changewatch-batch") as pool,
        ):

            def sync(name: str) -> tuple[str, list, Exception | None]:
                return name, *_collect(
                    lambda: sync_events(by_name[name], context, warehouse, poll_tags=polled)
                )

            for name, events, error in _each(pool, sync, config.sources):
                table = by_name[name].table
                yield from _report(context, table, events)
                if error is not None:
                    failed[name] = redact(first_line(error))
                    context.log.error(f"{name}: the sync failed: {failed[name]}")
                elif any(isinstance(e, dg.MaterializeResult) for e in events):
                    synced.add(name)
            # A watch runs when one of its sources is in the batch and none of those failed
            # or skipped (as its asset step would have been skipped).
            batch = set(config.sources)
            watches = [
                w
                for w in watches_file.watches
                if set(w.sources) & batch and not (set(w.sources) & batch) - synced
            ]

            def evaluate(watch) -> tuple[str, list, Exception | None]:
                sources = {n: by_name[n] for n in watch.sources}
                filters = watches_file.filters(watch)
                return watch.name, *_collect(
                    lambda: [evaluation_result(watch, sources, filters, context, warehouse, judges)]
                )

            by_watch = {w.name: w for w in watches}
            evaluated = list(_each(pool, evaluate, watches))
            settled = _settled(context, [(by_watch[n], ev) for n, ev, err in evaluated if not err])
            for name, events, error in evaluated:
                if name not in settled:
                    yield from _report(context, evaluation_asset_name(by_watch[name]), events)
                if error is not None:
                    failed[f"watch {name}"] = redact(first_line(error))
            if watches:
                result = delivery_result(watches_file, by_name, context, warehouse)
                yield from _report(context, NOTIFICATIONS_ASSET, [result])
        if failed:
            lines = [f"{name}: {why}" for name, why in sorted(failed.items())]
            raise dg.Failure(
                f"{len(failed)} of the batch failed: " + "; ".join(lines),
                allow_retries=True,
            )

    @dg.job(
        name=BATCH_JOB,
        executor_def=dg.in_process_executor,
        resource_defs=resources,
        description=(
            "Batched runs: the syncs of several sources due at one tick, their watches' "
            "evaluations and delivery, in one step; each asset's materialization and checks "
            "are reported as its own step would (pipeline/assets/batched_syncs.py)."
        ),
    )
    def _job():
        _batch()

    return _job


class _PooledWarehouse:
    """The step's ``WarehouseResource`` as its jobs see it: ``connect`` takes a connection the
    last job gave back, if any (warehouse/connection_pool.py); one per thread at most is kept."""

    def __init__(self, resource: WarehouseResource, threads: int) -> None:
        self._resource = resource
        self._pool = ConnectionPool(resource.url, size=threads)

    def connect(self):
        return self._pool.connect()

    def describe(self) -> str:
        return self._resource.describe()

    def __enter__(self) -> "_PooledWarehouse":
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.close()


# An evaluation's counts that say it did something (evaluation_result's metadata).
_DID_SOMETHING = ("changes_read", "held", "dropped", "filter_errors", "judge_errors", "judge_calls")


def _settled(context: dg.OpExecutionContext, evaluations: list[tuple]) -> set[str]:
    """The watches of ``evaluations`` (watch, events) whose evaluation read no change and
    whose checks' last results, in Dagster's storage, passed as these did: reporting them
    again would say nothing new. Most sources of a batch have not changed, and each such
    evaluation wrote three events (a materialization and two checks), most of a batched run's
    Dagster cost per source (issue 31). A watch whose checks failed last, or never ran, is
    reported, so the UI never keeps an old failure for a watch that has recovered."""
    quiet = {}
    for watch, events in evaluations:
        result = events[0] if len(events) == 1 else None
        if not isinstance(result, dg.MaterializeResult):
            continue
        metadata = result.metadata or {}
        checks = result.check_results or []
        if any(metadata.get(k) for k in _DID_SOMETHING) or metadata.get("judge_unavailable"):
            continue
        if not checks or not all(c.passed for c in checks):
            continue
        key = dg.AssetKey(evaluation_asset_name(watch))
        quiet[watch.name] = [dg.AssetCheckKey(key, c.check_name) for c in checks]
    if not quiet:
        return set()
    # One query for all of them (the checks' latest executions).
    latest = context.instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [k for keys in quiet.values() for k in keys]
    )
    passed = AssetCheckExecutionRecordStatus.SUCCEEDED
    return {
        name
        for name, keys in quiet.items()
        if all(k in latest and latest[k].status == passed for k in keys)
    }


def _collect(produce: Callable[[], Iterable]) -> tuple[list, Exception | None]:
    """Everything ``produce`` yields, and the exception it ended with, if any."""
    events: list = []
    try:
        for event in produce():
            events.append(event)
    except Exception as error:  # noqa: BLE001 - one source's failure is its own (module doc)
        return events, error
    return events, None


def _each(pool: ThreadPoolExecutor, work: Callable, items: Iterable) -> Iterator:
    """``work`` of each item on ``pool``, results as they finish."""
    futures = [pool.submit(work, item) for item in items]
    for future in as_completed(futures):
        yield future.result()


def _report(context: dg.OpExecutionContext, asset: str, events: list) -> Iterator:
    """An asset body's results as events of this step: a materialization (yielded) and check
    evaluations (logged; Dagster writes them before the next yielded event)."""
    key = dg.AssetKey(asset)
    for event in events:
        if isinstance(event, dg.MaterializeResult):
            yield dg.AssetMaterialization(asset_key=key, metadata=event.metadata or {})
            for check in event.check_results or []:
                context.log_event(_evaluation(key, check))
        elif isinstance(event, dg.AssetCheckResult):
            context.log_event(_evaluation(key, event))
        elif isinstance(event, dg.AssetObservation):
            yield event


def _evaluation(key: dg.AssetKey, check: dg.AssetCheckResult) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=check.asset_key or key,
        check_name=check.check_name,
        passed=check.passed,
        metadata=check.metadata or {},
        severity=check.severity,
        description=check.description,
    )
