"""Fleet sources in Dagster: one asset per fleet, a dynamic partition per target.

Where it sits: beside ``assets.py`` (plain sources) in the wiring. A fleet's sync asset
(named after its table) is partitioned by ``<fleet>_targets``; a run for one partition syncs
that target (``sources/fleet.py``: its own cursor and rows), a run over a range syncs each
target in it, one transaction each. Partitions follow the targets: the fleet sensor adds and
retires them to match the file's list; a query fleet's ``<table>_targets`` asset (in each of
the fleet's runs) reads the query from the warehouse and adds and retires them itself, since
only a run may open the warehouse. The sensor probes each target at the fleet's interval and,
when any changed (or at ``probe.reconcile``), requests one run over the whole fleet: unchanged
targets then cost one conditional request each, not a run each.
"""

# No `from __future__ import annotations` here: Dagster reads the asset functions' annotations
# at definition time to recognise the context and resource parameters.

import hashlib
import time
from collections.abc import Callable, Sequence

import dagster as dg
from changewatch.pipeline.assets.freshness_policies import source_freshness
from changewatch.pipeline.assets.rejected_records_check import (
    fleet_rejected_check_result,
    rejected_check_specs,
)
from changewatch.pipeline.assets.sync_assets import FULL_TAG, SILENT_TAG, SOURCE_TAG, STORM_CHECK
from changewatch.pipeline.polling.poll_slots import due_slot, jitter_offset
from changewatch.pipeline.polling.probe_decisions import decide, due_probes, probe_states
from changewatch.pipeline.project.warehouse_resource import WarehouseResource, warehouse_pool
from changewatch.pipeline.project.watches_file import DEFAULT_TICK
from changewatch.pipeline.triggers.sync_sensors import TRIGGER_TAG, sync_job_name
from changewatch.sources import SourceConfig, build_source
from changewatch.sources.base import SourceBase
from changewatch.sources.fleet import is_fleet, listed_targets, member, targets_query
from changewatch.sources.probe import ProbeClients, probe_all, probe_budget
from changewatch.sources.targets import check_target, query_tables
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.read_guard import QueryRefused, read_guard
from changewatch.warehouse.schema import changes_table
from changewatch.warehouse.statements import render
from changewatch.warehouse.sync import SyncSkipped, SyncStats, held_changes, run_sync

__all__ = [
    "FLEET_SENSOR",
    "TARGETS_CHECK",
    "fleet_assets",
    "fleet_jobs",
    "fleet_run_assets",
    "fleet_sensor",
    "match_partitions",
    "is_fleet",
    "partitions_name",
    "resolve_targets",
    "targets_asset_name",
    "targets_job_name",
    "targets_query",
]

FLEET_SENSOR = "sync_fleets"
# Fails while a target of the fleet's last run failed to sync (the others were stored).
TARGETS_CHECK = "targets_synced"
# How many of the fleet's targets were due (changed, failed to probe, or to reconcile).
TARGETS_TAG = "changewatch/targets"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
# Metadata of a target's sync (SyncStats fields), as the plain sync asset shows them.
_SHOWN = (
    "rows_fetched rows_duplicate inserted updated deleted unchanged changed row_count pages "
    "requests duration_s cursor_after sync_id silent storm_held not_modified"
).split()


def partitions_name(source: SourceBase) -> str:
    """The dynamic partitions (one per target) of fleet ``source``'s asset."""
    return f"{source.name}_targets"


def targets_asset_name(source: SourceBase) -> str:
    """The asset that reads a query fleet's targets from the warehouse."""
    return f"{source.table}_targets"


def targets_job_name(source: SourceBase) -> str:
    """The job that only reads a query fleet's targets (its first partitions come so)."""
    return f"resolve_{source.name}_targets"


def fleet_run_assets(source: SourceBase) -> list[str]:
    """What a run of fleet ``source`` runs before its sync: a query fleet reads its targets."""
    return [targets_asset_name(source)] if targets_query(source) is not None else []


def fleet_assets(source: SourceConfig, *, warehouse_url: str) -> list[dg.AssetsDefinition]:
    """The fleet's partitioned sync asset, and for a query fleet its targets asset."""
    partitions = dg.DynamicPartitionsDefinition(name=partitions_name(source))
    assets = [_sync_asset(source, partitions, warehouse_url)]
    if targets_query(source) is not None:
        assets.append(_targets_asset(source, partitions))
    return assets


def fleet_jobs(source: SourceConfig) -> "list[dg.UnresolvedAssetJobDefinition]":
    """A query fleet's targets-only job (the sensor's first run of it, before any partition)."""
    if targets_query(source) is None:
        return []
    return [
        dg.define_asset_job(
            targets_job_name(source),
            selection=dg.AssetSelection.assets(targets_asset_name(source)),
            tags={SOURCE_TAG: source.name},
            executor_def=dg.in_process_executor,
            description=f"Read the targets of fleet {source.name} from the warehouse.",
        )
    ]


def _sync_asset(
    source: SourceConfig, partitions: dg.DynamicPartitionsDefinition, warehouse_url: str
) -> dg.AssetsDefinition:
    """The fleet's sync asset: each target of the run's partitions synced on its own."""

    @dg.asset(
        name=source.table,
        group_name="sync",
        partitions_def=partitions,
        # Targets share the table, its change log and the fleet's sync lock: one at a time.
        pool=warehouse_pool(warehouse_url, "source", source.name),
        output_required=False,
        kinds={"python", "sql"},
        tags={SOURCE_TAG: source.name},
        freshness_policy=source_freshness(source),
        deps=[dg.AssetKey(targets_asset_name(source))] if targets_query(source) else [],
        description=(
            source.description
            or f"{source.name}: a fleet of {source.type} targets synced into table "
            f"`{source.table}`, a partition per target; every change is appended to "
            f"`{changes_table(source.table)}`."
        ),
        check_specs=[
            dg.AssetCheckSpec(STORM_CHECK, asset=source.table),
            dg.AssetCheckSpec(
                TARGETS_CHECK,
                asset=source.table,
                description="Fails while a target of the last run failed to sync.",
            ),
            *rejected_check_specs(source),
        ],
        metadata={"source": source.name, "primary_key": ", ".join(source.primary_key)},
    )
    def _sync(context: dg.AssetExecutionContext, warehouse: WarehouseResource):
        targets = _live(context, source)
        synced: dict[str, SyncStats] = {}
        failed: dict[str, str] = {}
        skipped: dict[str, str] = {}
        with warehouse.connect() as wh:
            for target in targets:
                try:
                    synced[target] = run_sync(
                        wh,
                        build_source(member(source, target)),  # type: ignore[arg-type]
                        dagster_run_id=context.run.run_id,
                        silent=context.run.tags.get(SILENT_TAG) == "true",
                        full=context.run.tags.get(FULL_TAG) == "true",
                    )
                except SyncSkipped as skip:
                    skipped[target] = str(skip)
                except Exception as error:
                    if len(context.partition_keys) == 1:
                        raise  # a run of one target fails as a plain sync does
                    # The others go on: each target is its own transaction.
                    failed[target] = f"{type(error).__name__}: {error}"
                    context.log.error(f"{source.name}[{target}]: {failed[target]}")
            held = held_changes(wh, source) if synced else 0
            rejected = (
                [fleet_rejected_check_result(wh, [s.source for s in synced.values()])]
                if synced and rejected_check_specs(source)
                else []
            )
        for stats in synced.values():
            context.log.info(
                f"{stats.source}: {stats.inserted} inserted, {stats.updated} updated, "
                f"{stats.deleted} deleted, {stats.unchanged} unchanged in {stats.duration_s}s"
            )
        if not synced:
            # Nothing stored (skipped, or only retired targets): observed, not materialized.
            reasons = {**skipped, **failed} or {"": "no target of this run is a target now"}
            context.log.info(f"{source.name}: nothing synced: {reasons}")
            yield dg.AssetObservation(
                asset_key=source.table, metadata={"skipped": str(reasons)[:2000]}
            )
            return
        yield dg.MaterializeResult(
            metadata=_metadata(synced, failed, skipped, warehouse.describe()),
            check_results=[
                dg.AssetCheckResult(
                    check_name=STORM_CHECK,
                    passed=held == 0,
                    metadata={"held_changes": held},
                ),
                dg.AssetCheckResult(
                    check_name=TARGETS_CHECK,
                    passed=not failed,
                    metadata={"failed": ", ".join(sorted(failed))},
                    description=(
                        f"{len(failed)} target(s) failed: " + "; ".join(failed.values())[:1000]
                        if failed
                        else f"{len(synced)} target(s) synced"
                    ),
                ),
                *rejected,
            ],
        )

    return _sync


def _live(context: dg.AssetExecutionContext, source: SourceBase) -> list[str]:
    """The run's partitions that are targets now: a retired one (off the file's list, or out
    of the query's answer in this run) is left alone, with a line in the log."""
    listed = listed_targets(source)
    if listed is not None:
        now = set(listed)
    else:
        now = set(context.instance.get_dynamic_partitions(partitions_name(source)))
    retired = [k for k in context.partition_keys if k not in now]
    if retired:
        context.log.info(f"{source.name}: not a target any more, not synced: {retired}")
    return [k for k in context.partition_keys if k in now]


def _metadata(
    synced: dict[str, SyncStats], failed: dict[str, str], skipped: dict[str, str], where: str
) -> dict:
    """One target's figures as they are; several targets' summed, with a line per target."""
    if len(synced) == 1 and not failed and not skipped:
        [(target, stats)] = synced.items()
        shown = {k: v for k, v in stats.as_dict().items() if k in _SHOWN}
        return {"target": target, **_typed(shown), "warehouse": where}
    figures = ("inserted", "updated", "deleted", "unchanged", "changed", "requests")
    lines = [
        f"| {t} | ok | " + " | ".join(str(getattr(s, f)) for f in figures) + " |"
        for t, s in synced.items()
    ]
    lines += [f"| {t} | failed: {e[:200]} |" for t, e in failed.items()]
    lines += [f"| {t} | skipped |" for t in skipped]
    table = "\n".join(["| target | sync | " + " | ".join(figures) + " |", "|---" * 8 + "|"])
    return {
        "targets_synced": len(synced),
        "targets_failed": len(failed),
        "failed": "; ".join(f"{t}: {e}" for t, e in failed.items())[:2000],
        **{f: sum(getattr(s, f) for s in synced.values()) for f in figures},
        "targets": dg.MetadataValue.md("\n".join([table, *lines])),
        "warehouse": where,
    }


def _typed(values: dict) -> dict:
    # None is no metadata value; a cursor not set yet shows as "".
    return {k: "" if v is None else v for k, v in values.items()}


def _targets_asset(
    source: SourceConfig, partitions: dg.DynamicPartitionsDefinition
) -> dg.AssetsDefinition:
    """Reads a query fleet's targets and makes its partitions match them."""
    query = targets_query(source)
    assert query is not None
    # Lineage: the synced tables the query reads (change logs and others have no asset).
    read = [dg.AssetKey(t) for t in query_tables(query) if not t.endswith("_changes")]

    @dg.asset(
        name=targets_asset_name(source),
        group_name="sync",
        deps=read,
        kinds={"sql"},
        tags={SOURCE_TAG: source.name},
        description=f"The targets of fleet {source.name}: the first column of `{query}`.",
    )
    def _targets(context: dg.AssetExecutionContext, warehouse: WarehouseResource):
        with warehouse.connect() as wh:
            targets = resolve_targets(wh, source)
        name = partitions.name
        assert name is not None
        before = list(context.instance.get_dynamic_partitions(name))
        added = [t for t in targets if t not in set(before)]
        retired = [t for t in before if t not in set(targets)]
        if added:
            context.instance.add_dynamic_partitions(name, added)
        for target in retired:
            # Its rows and change log stay; only its syncs stop.
            context.instance.delete_dynamic_partition(name, target)
        context.log.info(
            f"{source.name}: {len(targets)} target(s), added {added}, retired {retired}"
        )
        return dg.MaterializeResult(
            metadata={
                "targets": len(targets),
                "added": ", ".join(added)[:2000],
                "retired": ", ".join(retired)[:2000],
            }
        )

    return _targets


def _slot(source: SourceBase, now: float) -> int:
    return due_slot(now, source.interval, jitter_offset(source.name, source.jitter))


def resolve_targets(wh: Warehouse, source: SourceBase) -> list[str]:
    """The targets a query fleet has now: the first column of its query (a read of the
    warehouse's tables, checked as ``changewatch sql`` checks one), nulls and repeats
    dropped, in the query's order. Raises ``ValueError`` naming the source."""
    query = targets_query(source)
    assert query is not None
    rows = wh.fetch(render("select_tables_schema", wh.dialect))
    catalog, schema = rows[0][0], rows[0][1] or getattr(wh, "schema", None) or "public"
    qualifier = [schema] if wh.dialect == "postgres" else [catalog, schema]
    tables = {name.lower(): name for _, _, name in rows if name is not None}
    try:
        statement = read_guard(query, dialect=wh.dialect, tables=tables, schema=qualifier)
    except QueryRefused as error:
        raise ValueError(f"source {source.name!r}: targets query refused: {error}") from None
    targets: dict[str, None] = {}
    with wh.transaction():
        for row in wh.fetch(statement):
            if row and row[0] is not None:
                try:
                    targets[check_target(str(row[0]))] = None
                except ValueError as error:
                    raise ValueError(f"source {source.name!r}: targets query: {error}") from None
    return list(targets)


def fleet_sensor(
    fleets: Sequence[SourceConfig],
    jobs: "Sequence[dg.UnresolvedAssetJobDefinition]",
    *,
    clock: Callable[[], float] = time.time,
    clients: ProbeClients | None = None,
    tick: float = DEFAULT_TICK,
) -> dg.SensorDefinition:
    """The sensor of the fleets: partitions to match the file's targets, a probe per target,
    and one run per fleet over the targets that changed.

    Each target is probed as a source of its own (``<fleet>[<target>]``, with its own jitter,
    probe state and ``probe.reconcile`` in the cursor; the rules are the sync sensor's,
    ``pipeline/polling/probe_decisions.py``), so a fleet's probes run concurrently like any
    sources'. The targets due at one tick become one run of the fleet's job over the partition range
    from the first to the last of them (targets in between cost a conditional request each), its
    run key a hash of theirs. A query fleet's targets are its partitions, as its last run
    resolved them; with none yet, the sensor asks its targets job once per interval slot.
    ``tick``: the least seconds between two evaluations (the watches file's ``polling: tick``).
    """
    pool: list[ProbeClients] = [clients] if clients is not None else []
    members: dict[tuple[str, str], SourceBase] = {}  # configs of targets, made once

    def member_of(fleet: SourceBase, target: str) -> SourceBase:
        key = (fleet.name, target)
        if key not in members:
            members[key] = member(fleet, target)
        return members[key]

    @dg.sensor(
        name=FLEET_SENSOR,
        jobs=list(jobs),
        minimum_interval_seconds=round(tick),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Keeps each fleet's partitions to its targets, probes every target at the fleet's "
            "interval and requests one run of a fleet over the targets that changed."
        ),
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        now = clock()
        if not pool:
            pool.append(ProbeClients())  # in the code server, kept for its lifetime
        partition_requests, targets = _partitions(context.instance, fleets)
        owner = {}
        for fleet in fleets:
            for target in targets[fleet.name]:
                owner[member_of(fleet, target).name] = (fleet, target)
        configs = [member_of(fleet, target) for fleet, target in owner.values()]
        due = due_probes(configs, context.cursor, now)
        results = probe_all(due, probe_states(context.cursor), pool[0], budget=probe_budget())
        decision = decide(configs, context.cursor, results, now)
        for error in decision.errors.values():
            context.log.warning("probe failed, syncing at the interval: %s", error)
        by_fleet: dict[str, list] = {}
        for request in decision.requests:
            by_fleet.setdefault(owner[request.source][0].name, []).append(request)
        requests = [
            _fleet_run(fleet, targets[fleet.name], by_fleet[fleet.name], owner)
            for fleet in fleets
            if fleet.name in by_fleet
        ]
        requests += [
            # No partition yet: the targets job reads them, once per interval slot.
            dg.RunRequest(
                run_key=f"{f.name}:targets:{_slot(f, now)}",
                job_name=targets_job_name(f),
                tags={SOURCE_TAG: f.name, TRIGGER_TAG: "targets"},
            )
            for f in fleets
            if not targets[f.name] and targets_query(f) is not None
        ]
        return dg.SensorResult(
            run_requests=requests,
            cursor=decision.cursor,
            dynamic_partitions_requests=partition_requests,
        )

    return _sensor


def _partitions(
    instance: dg.DagsterInstance, fleets: Sequence[SourceBase]
) -> tuple[list, dict[str, list[str]]]:
    """The partition requests that make list fleets' partitions their targets, and each
    fleet's targets in the order Dagster keeps its partitions (new ones last)."""
    requests: list = []
    targets: dict[str, list[str]] = {}
    for fleet in fleets:
        name = partitions_name(fleet)
        current = list(instance.get_dynamic_partitions(name))
        listed = listed_targets(fleet)
        if listed is None:
            targets[fleet.name] = current  # a query fleet's run keeps them
            continue
        added = [t for t in listed if t not in set(current)]
        retired = [t for t in current if t not in set(listed)]
        if added:
            requests.append(dg.AddDynamicPartitionsRequest(name, added))
        if retired:
            requests.append(dg.DeleteDynamicPartitionsRequest(name, retired))
        targets[fleet.name] = [t for t in current if t not in set(retired)] + added
    return requests, targets


def match_partitions(instance: dg.DagsterInstance, source: SourceBase) -> list[str]:
    """Make a list fleet's partitions its targets now (a query fleet's are its last run's);
    return them in Dagster's order. For runs started outside the sensor (the CLI)."""
    requests, targets = _partitions(instance, [source])
    for request in requests:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
    return targets[source.name]


def _fleet_run(
    fleet: SourceBase, order: list[str], due: list, owner: dict[str, tuple[SourceBase, str]]
) -> dg.RunRequest:
    """One run of ``fleet`` over the partition range holding every target in ``due``."""
    places = sorted(order.index(owner[r.source][1]) for r in due)
    keys = "\n".join(sorted(r.run_key for r in due))
    reasons = {r.reason for r in due}
    return dg.RunRequest(
        # From the targets' own keys: the same tick evaluated again asks the same run.
        run_key=f"{fleet.name}:{hashlib.sha256(keys.encode()).hexdigest()[:16]}",
        job_name=sync_job_name(fleet),  # type: ignore[arg-type]
        tags={
            SOURCE_TAG: fleet.name,
            TRIGGER_TAG: next(r for r in ("probe", "interval", "reconcile") if r in reasons),
            TARGETS_TAG: str(len(due)),
            RANGE_START_TAG: order[places[0]],
            RANGE_END_TAG: order[places[-1]],
        },
    )
