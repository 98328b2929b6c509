"""Sync assets: one per configured source, named after the table it writes."""

# No `from __future__ import annotations` here: Dagster reads the asset function's annotations
# at definition time to recognise the context and resource parameters.

import time
from collections.abc import Callable, Iterator, Mapping

import dagster as dg
from changewatch.pipeline.assets.asset_signatures import shared_signature
from changewatch.pipeline.assets.freshness_policies import source_freshness
from changewatch.pipeline.assets.rejected_records_check import (
    REJECTED_CHECK,
    rejected_check_result,
    rejected_check_specs,
    rejected_check_unknown,
)
from changewatch.pipeline.polling.poll_schedule import record_from_tags
from changewatch.pipeline.polling.source_pauses import (
    NOT_PAUSED_CHECK,
    not_paused_result,
    read_pauses,
)
from changewatch.pipeline.project.warehouse_resource import (
    WAREHOUSE_POOL,
    WarehouseResource,
    warehouse_pool,
)
from changewatch.pipeline.webhooks.webhook_inbox import INBOX_ERRORS, open_inbox
from changewatch.sources import SourceConfig, build_source
from changewatch.warehouse.schema import changes_table
from changewatch.warehouse.sync import SyncSkipped, SyncStats, held_changes, run_sync
from dagster import AssetExecutionContext

__all__ = [
    "FULL_TAG",
    "SILENT_TAG",
    "SOURCE_TAG",
    "STORM_CHECK",
    "WAREHOUSE_POOL",
    "sync_asset",
    "sync_events",
]

SOURCE_TAG = "changewatch/source"
STORM_CHECK = "no_change_storm"
# Run tags a sync asset obeys: record changes silently (a backfill), or walk everything
# (a reconciliation sweep that turns vanished objects into deletes).
SILENT_TAG = "changewatch/silent"
FULL_TAG = "changewatch/full"


def sync_asset(source: SourceConfig, *, warehouse_url: str) -> dg.AssetsDefinition:
    """The asset that syncs ``source`` into its table and appends to its change log."""

    @dg.asset(
        name=source.table,
        group_name="sync",
        # On PostgreSQL a pool per source: syncs of different sources write different tables
        # and `sync_state` rows, and the commit takes `changewatch:sync:<source>` (so two
        # syncs of one source never interleave even outside Dagster).
        pool=warehouse_pool(warehouse_url, "source", source.name),
        # A sync that finds another one of its source running materializes nothing (it is
        # observed as skipped), and the watches after it in the run skip too.
        output_required=False,
        kinds={"python", "sql"},
        tags={SOURCE_TAG: source.name},
        freshness_policy=source_freshness(source),
        description=(
            source.description
            or f"{source.name}: {source.type} source synced into table `{source.table}` "
            f"({source.sync}); every insert, update and delete is appended to "
            f"`{changes_table(source.table)}`."
        ),
        check_specs=[
            dg.AssetCheckSpec(
                STORM_CHECK,
                asset=source.table,
                description=(
                    "Fails while changes of a sync that changed more than "
                    f"{source.storm.max_share:.0%} of the rows are held from evaluation; "
                    f"`changewatch release {source.name}` (or `--discard`) settles them."
                ),
            ),
            *_pause_check(source),
            *rejected_check_specs(source),
        ],
        metadata={
            "source": source.name,
            "primary_key": ", ".join(source.primary_key),
            "cursor_column": source.updated_at or "",
            "change_log": changes_table(source.table),
            "dagster/table_name": source.table,
        },
    )
    @shared_signature  # Dagster reads it ~17 times (pipeline/assets/asset_signatures.py)
    def _sync(context: AssetExecutionContext, warehouse: WarehouseResource):  # yields its events
        yield from sync_events(source, context, warehouse)

    return _sync


def sync_events(
    source: SourceConfig,
    context,
    warehouse: WarehouseResource,
    *,
    poll_tags: Mapping[str, str] | None = None,
) -> Iterator:
    """What a sync of ``source`` reports, in order: an observation and check results when it
    skipped (another sync of the source was running), else its MaterializeResult (with its
    checks); on failure the check results, then the error is raised.

    The body of the sync asset, and of each sync in a batched run's one step
    (pipeline/assets/batched_syncs.py). ``context`` is the asset's or the batch op's: only its
    run, log and instance are used. ``poll_tags`` carry the sensor's schedule of the source
    where the run's tags do not (a batched run has it in its config).
    """
    inbox = open_inbox() if source.webhook is not None else None
    # The webhook deliveries stored before this sync fetches are covered by it.
    covered = _inbox(context, lambda: inbox.watermark(source.name)) if inbox else 0
    try:
        with warehouse.connect() as wh:
            try:
                stats = run_sync(
                    wh,
                    build_source(source),
                    dagster_run_id=context.run.run_id,
                    silent=context.run.tags.get(SILENT_TAG) == "true",
                    full=context.run.tags.get(FULL_TAG) == "true",
                )
            except SyncSkipped as skipped:
                context.log.info(f"{source.name}: {skipped}")
                yield dg.AssetObservation(
                    asset_key=source.table, metadata={"skipped": str(skipped)}
                )
                # The check is the other sync's to evaluate: this one says so, and passes.
                yield dg.AssetCheckResult(
                    check_name=STORM_CHECK, passed=True, description=str(skipped)
                )
                yield from _paused(context, source)
                yield from _rejected_passes(source, str(skipped))
                return
            held = held_changes(wh, source)
            rejected = [rejected_check_result(wh, source)] if rejected_check_specs(source) else []
            # The sensor's decision about this source, in its run tag
            # (pipeline/polling/poll_schedule.py).
            polled = record_from_tags(
                wh, context.run.tags if poll_tags is None else poll_tags, [source.name]
            )
    except Exception:
        # The run fails with the sync's own error (its API down...). Left unanswered, the
        # checks would show as failed beside it, a storm alarm for what is no storm: they
        # are answered from what is stored, and the error goes on.
        yield _storm_check_after_failure(warehouse, source)
        yield from _paused(context, source)
        yield from _rejected_after_failure(warehouse, source)
        raise
    # Only once the rows are committed: a failed sync leaves its deliveries pending.
    run_id = context.run.run_id
    consumed = (
        _inbox(context, lambda: inbox.consume(source.name, covered, by=run_id)) if inbox else 0
    )
    if stats.drift:
        context.log.warning(
            f"{source.name}: new payload fields {sorted(stats.drift)} "
            f"(schema: {source.schema_mode}): {_drift(stats)}"
        )
    if stats.storm_held:
        context.log.warning(
            f"{source.name}: change storm: {stats.changed} changes in one sync; they are "
            f"held from evaluation until `changewatch release {source.name}`"
        )
    if stats.rows_duplicate:
        context.log.warning(f"{source.name}: {_duplicates(stats, source)}")
    if stats.rejected:
        context.log.warning(
            f"{source.name}: {stats.rejected} record(s) rejected and left out "
            "(on_bad_record: skip): see table rejected_records; the next sync retries them"
        )
    # No info line of the counts: they are the materialization's metadata, shown beside it
    # in the run's log, and a line of their own was one more event-log write per changed
    # source (issue 31, point 5; bench/bench_batch_cost.py). Warnings above still go there.
    yield dg.MaterializeResult(
        metadata={
            "rows_fetched": stats.rows_fetched,
            "rows_duplicate": stats.rows_duplicate,
            "rejected": stats.rejected,
            "inserted": stats.inserted,
            "updated": stats.updated,
            "deleted": stats.deleted,
            "unchanged": stats.unchanged,
            "changed": stats.changed,
            "row_count": stats.row_count,
            "pages": stats.pages,
            "http_requests": stats.requests,
            "duration_s": dg.MetadataValue.float(stats.duration_s),
            "cursor": stats.cursor_after or "",
            "sync_id": stats.sync_id,
            "columns_added": ", ".join(stats.columns_added),
            "warehouse": warehouse.describe(),
            "silent": stats.silent,
            "storm_held": stats.storm_held,
            "not_modified": stats.not_modified,
            "schema_drift": _drift(stats),
            **({"webhook_deliveries": consumed} if inbox else {}),
            **{f"poll_{k}": v for r in polled for k, v in _poll_metadata(r).items()},
        },
        check_results=[_storm_check(held), *_paused(context, source), *rejected],
    )


def _rejected_passes(source: SourceConfig, why: str) -> list[dg.AssetCheckResult]:
    """The ``no_rejected_records`` result of a sync that left it to another one (skipped)."""
    if not rejected_check_specs(source):
        return []
    return [dg.AssetCheckResult(check_name=REJECTED_CHECK, passed=True, description=why)]


def _rejected_after_failure(
    warehouse: WarehouseResource, source: SourceConfig
) -> list[dg.AssetCheckResult]:
    """The ``no_rejected_records`` result beside a failed sync: as the last committed one left
    it (a failed sync stores no rejection), or not evaluated when that cannot be read."""
    if not rejected_check_specs(source):
        return []
    try:
        with warehouse.connect() as wh:
            return [rejected_check_result(wh, source)]
    except Exception as error:  # noqa: BLE001 - any failure to read is "not evaluated"
        return [rejected_check_unknown(source, error)]


def _storm_check(held: int) -> dg.AssetCheckResult:
    """The ``no_change_storm`` result: failed while changes of a storm are held."""
    return dg.AssetCheckResult(
        check_name=STORM_CHECK,
        passed=held == 0,
        metadata={"held_changes": held},
        description=f"{held} change(s) held after a change storm" if held else "none held",
    )


def _storm_check_after_failure(
    warehouse: WarehouseResource, source: SourceConfig
) -> dg.AssetCheckResult:
    """The ``no_change_storm`` result beside a failed sync: a failed sync holds nothing, so
    the changes held by earlier ones are counted; if even that fails (the warehouse down,
    or no sync ever stored the source), the check passes as not evaluated, since the failure
    is the run's to report, not a storm."""
    try:
        with warehouse.connect() as wh:
            return _storm_check(held_changes(wh, source))
    except Exception as error:  # noqa: BLE001 - any failure to count is "not evaluated"
        return dg.AssetCheckResult(
            check_name=STORM_CHECK,
            passed=True,
            metadata={"evaluated": False},
            description=(
                "not evaluated: the sync failed, and its held changes could not be counted "
                f"({type(error).__name__}; the run's failure says more)"
            ),
        )


def _pause_check(source: SourceConfig) -> list[dg.AssetCheckSpec]:
    """The ``not_paused`` check of a source with stop conditions
    (pipeline/polling/source_pauses.py)."""
    if not source.stop.active:
        return []
    return [
        dg.AssetCheckSpec(
            NOT_PAUSED_CHECK,
            asset=source.table,
            description=(
                "Fails while the source is paused by one of its stop conditions (until, "
                f"after_notifications, max_failures); `changewatch resume {source.name}` "
                "resumes it."
            ),
        )
    ]


def _paused(context: AssetExecutionContext, source: SourceConfig) -> list[dg.AssetCheckResult]:
    """The ``not_paused`` result a run reports: a sync started by hand may run while paused."""
    if not source.stop.active:
        return []
    pauses = read_pauses(context.instance, "source", [source.name])
    return [not_paused_result("source", source.name, pauses, time.time())]


def _poll_metadata(row) -> dict:
    """The sensor's schedule of the source, shown with the materialization."""
    due = row.next_due
    return {
        "next_due": dg.MetadataValue.timestamp(due) if due is not None else "paused",
        "interval_s": dg.MetadataValue.float(row.interval_s),
        "reason": row.reason,
    }


def _inbox(context: AssetExecutionContext, call: Callable[[], int]) -> int:
    """A webhook inbox read or write whose failure only delays: the deliveries stay pending
    and a later sync covers them; the data of this one is stored either way."""
    try:
        return call()
    except INBOX_ERRORS as error:
        context.log.warning(f"webhook inbox: {error}; its deliveries wait for a later sync")
        return 0


def _duplicates(stats: SyncStats, source: SourceConfig) -> str:
    """How many records repeated a key of the sync, and which one each key kept.

    >>> from changewatch.sources.base import SourceBase
    >>> config = SourceBase(name="s", type="rest", table="t", primary_key="id",
    ...                     columns={"id": "bigint"})
    >>> _duplicates(SyncStats("s", "x", rows_duplicate=2), config)
    '2 record(s) repeated a key of this sync; each key keeps its last record in walk order'
    """
    kept = (
        f"its newest record by {source.updated_at}, then the last in walk order"
        if source.updated_at
        else "its last record in walk order"
    )
    return f"{stats.rows_duplicate} record(s) repeated a key of this sync; each key keeps {kept}"


def _drift(stats: SyncStats) -> str:
    """Each new payload field, its type and what became of it (a column, or why not).

    >>> _drift(SyncStats("s", "x", drift={"supplierRef": "text", "_rev": "bigint"},
    ...                  drift_actions={"supplierRef": "column supplier_ref",
    ...                                 "_rev": "raw only: '_rev' is no column name"}))
    "_rev (bigint): raw only: '_rev' is no column name, supplierRef (text): column supplier_ref"
    """
    return ", ".join(
        f"{f} ({t})" + (f": {stats.drift_actions[f]}" if f in stats.drift_actions else "")
        for f, t in sorted(stats.drift.items())
    )
