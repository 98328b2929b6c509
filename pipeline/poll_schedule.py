"""The sensor's polling decisions, carried in run tags into the ``poll_schedule`` table.

The sync sensor never opens the warehouse, so it hands each source's schedule (next due
time, interval, reason, failures, paused) to the runs it requests, in ``POLL_TAG``; a sync
writes its source's row when it is done (``record_from_tags``). A pause or resume leaves no
sync to carry it, so the sensor then requests a run of ``POLL_SCHEDULE_JOB``, whose only
asset writes the rows of its tag. The tag is also what the UI shows on each run.
"""

# No `from __future__ import annotations` here: Dagster reads the asset function's annotations
# at definition time to recognise the context and resource parameters.

import hashlib
import json
from collections.abc import Iterable, Mapping

import dagster as dg
from changewatch.pipeline.probing import Schedule
from changewatch.pipeline.resources import WarehouseResource, warehouse_pool
from changewatch.warehouse.poll_schedule import PollRow, record_poll_schedule
from dagster import AssetExecutionContext

__all__ = [
    "POLL_SCHEDULE_ASSET",
    "POLL_SCHEDULE_JOB",
    "POLL_TAG",
    "merged_tag",
    "poll_schedule_asset",
    "poll_schedule_job",
    "record_from_tags",
    "rows_of",
    "schedule_run",
    "schedule_tag",
]

POLL_TAG = "changewatch/poll_schedule"
POLL_SCHEDULE_ASSET = "poll_schedule"
POLL_SCHEDULE_JOB = "record_poll_schedule"


def schedule_tag(schedules: Mapping[str, Schedule], names: Iterable[str], now: float) -> str:
    """The tag carrying the schedules of ``names``, decided at ``now``.

    >>> schedule_tag({"a": Schedule(160.0, 60.0, "changed")}, ["a"], 100.0)
    '{"at":100.0,"s":{"a":[160.0,60.0,"changed",0,false]}}'
    """
    rows = {
        name: [s.next_due, s.interval, s.reason, s.failures, s.paused]
        for name in names
        if (s := schedules.get(name)) is not None
    }
    return json.dumps({"at": now, "s": rows}, separators=(",", ":"))


def merged_tag(values: Iterable[str]) -> str:
    """One tag holding the rows of several (a batched run's), at the newest decision time."""
    at, rows = 0.0, {}
    for value in values:
        data = json.loads(value)
        at = max(at, data["at"])
        rows.update(data["s"])
    return json.dumps({"at": at, "s": rows}, separators=(",", ":"))


def rows_of(value: str | None, names: Iterable[str] | None = None) -> list[PollRow]:
    """The rows a tag carries (of ``names`` only, when given); none from a missing tag.

    >>> [r.reason for r in rows_of('{"at":1.0,"s":{"a":[null,60.0,"paused",3,true]}}')]
    ['paused']
    """
    if not value:
        return []
    data = json.loads(value)
    wanted = None if names is None else set(names)
    return [
        PollRow(name, due, interval, reason, failures, paused, data["at"])
        for name, (due, interval, reason, failures, paused) in data["s"].items()
        if wanted is None or name in wanted
    ]


def record_from_tags(wh, tags: Mapping[str, str], names: Iterable[str] | None) -> list[PollRow]:
    """Write the rows of ``names`` the run's tag carries (a run started by hand has none)."""
    rows = rows_of(tags.get(POLL_TAG), names)
    record_poll_schedule(wh, rows)
    return rows


def schedule_run(tag: str) -> dg.RunRequest:
    """A run that only records ``tag``'s rows (a pause or resume, which no sync carries)."""
    digest = hashlib.sha256(tag.encode()).hexdigest()[:16]
    return dg.RunRequest(
        # From the decision itself: the same tick evaluated again asks the same run.
        run_key=f"poll_schedule:{digest}",
        job_name=POLL_SCHEDULE_JOB,
        tags={POLL_TAG: tag},
    )


def poll_schedule_asset(*, warehouse_url: str) -> dg.AssetsDefinition:
    """The asset that writes the rows of its run's ``POLL_TAG`` into ``poll_schedule``."""

    @dg.asset(
        name=POLL_SCHEDULE_ASSET,
        group_name="sync",
        pool=warehouse_pool(warehouse_url, "poll_schedule"),
        kinds={"sql"},
        description=(
            "Each interval source's polling as the sync sensor decided it (next due time, "
            "interval, reason, failed probes in a row, paused). Syncs write their own source's "
            "row; this asset's runs carry pauses and resumes."
        ),
    )
    def _record(
        context: AssetExecutionContext, warehouse: WarehouseResource
    ) -> dg.MaterializeResult:
        with warehouse.connect() as wh:
            rows = record_from_tags(wh, context.run.tags, names=None)
        for row in rows:
            state = "paused" if row.paused else "polled"
            context.log.info(f"{row.source}: {state}: {row.reason}")
        return dg.MaterializeResult(metadata={"sources": ", ".join(r.source for r in rows)})

    return _record


def poll_schedule_job() -> "dg.UnresolvedAssetJobDefinition":
    return dg.define_asset_job(
        POLL_SCHEDULE_JOB,
        selection=dg.AssetSelection.assets(POLL_SCHEDULE_ASSET),
        executor_def=dg.in_process_executor,
        description="Record sources paused or resumed in the poll_schedule table.",
    )
