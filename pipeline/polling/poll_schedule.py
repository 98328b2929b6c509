"""The sensor's polling decisions, carried in run tags into the ``poll_schedule`` table.

The sync sensor never opens the warehouse, so it hands each source's schedule (next due
time, interval, reason, failures, paused) to the runs it requests, in ``POLL_TAG``; a sync
writes its source's row when it is done (``record_from_tags``). A pause or resume leaves no
sync to carry it, so the sensor then requests a run of ``POLL_SCHEDULE_JOB``, whose only
asset writes the rows of its tag. The tag is also what the UI shows on each run, so it
reads as words: a line per source, its next due time in ISO 8601 (UTC), the reason.
"""

# No `from __future__ import annotations` here: Dagster reads the asset function's annotations
# at definition time to recognise the context and resource parameters.

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

import dagster as dg
from changewatch.pipeline.polling.probe_decisions import Schedule
from changewatch.pipeline.project.warehouse_resource import WarehouseResource, warehouse_pool
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
    """The tag carrying the schedules of ``names``, decided at ``now``: a line per source, as
    the UI shows it, read back by ``rows_of``.

    >>> print(schedule_tag({"a": Schedule(1795889010.0, 150.0, "changed")}, ["a"], 1795888860.0))
    a: next 2026-11-28T18:03:30Z, every 150s: changed (decided 2026-11-28T18:01:00Z)
    >>> print(schedule_tag({"a": Schedule(None, 60.0, "HTTP 500", 3, True)}, ["a"], 1795888860.5))
    a: paused, every 60s, 3 failed: HTTP 500 (decided 2026-11-28T18:01:00.500000Z)
    """
    lines = []
    for name in names:
        if (s := schedules.get(name)) is None:
            continue
        state = "paused" if s.paused else f"next {_iso(s.next_due)}"
        failed = f", {s.failures} failed" if s.failures else ""
        reason = " ".join(s.reason.split())  # one line per source
        lines.append(
            f"{name}: {state}, every {_number(s.interval)}s{failed}: {reason} (decided {_iso(now)})"
        )
    return "\n".join(lines)


def merged_tag(values: Iterable[str]) -> str:
    """One tag holding the rows of several (a batched run's)."""
    return "\n".join(value for value in values if value)


def rows_of(value: str | None, names: Iterable[str] | None = None) -> list[PollRow]:
    """The rows a tag carries (of ``names`` only, when given); none from a missing tag.

    >>> [row] = rows_of("a: paused, every 60s, 3 failed: x (decided 1970-01-01T00:00:01Z)")
    >>> row.next_due, row.interval_s, row.reason, row.consecutive_failures, row.decided_at
    (None, 60.0, 'x', 3, 1.0)
    """
    if not value:
        return []
    if value.startswith("{"):  # a run requested before tags were lines: JSON, epoch seconds
        data = json.loads(value)
        rows = [
            PollRow(name, due, interval, reason, failures, paused, data["at"])
            for name, (due, interval, reason, failures, paused) in data["s"].items()
        ]
    else:
        rows = [_row(line) for line in value.splitlines()]
    wanted = None if names is None else set(names)
    return [row for row in rows if wanted is None or row.source in wanted]


# A line of the tag: `<source>: next <ISO time>|paused, every <seconds>s[, <n> failed]: <reason>
# (decided <ISO time>)`; the reason is free text, so it is matched last but one.
_LINE = re.compile(
    r"(?P<source>.+?): (?:next (?P<due>\S+)|(?P<paused>paused)), every (?P<interval>\S+)s"
    r"(?:, (?P<failures>\d+) failed)?: (?P<reason>.*) \(decided (?P<at>\S+)\)"
)


def _row(line: str) -> PollRow:
    match = _LINE.fullmatch(line)
    if match is None:
        raise ValueError(f"{POLL_TAG}: not a schedule line: {line!r}")
    due = match["due"]
    return PollRow(
        match["source"],
        None if due is None or due == "none" else _epoch(due),
        float(match["interval"]),
        match["reason"],
        int(match["failures"] or 0),
        match["paused"] is not None,
        _epoch(match["at"]),
    )


def _iso(epoch: float | None) -> str:
    """Epoch seconds as UTC ISO 8601 (microseconds, as the table keeps them, when not whole).

    >>> _iso(0.0), _iso(1.25), _iso(None)
    ('1970-01-01T00:00:00Z', '1970-01-01T00:00:01.250000Z', 'none')
    """
    if epoch is None:
        return "none"
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _number(value: float) -> str:
    """``value`` as short as it reads back exactly.

    >>> _number(150.0), _number(157.5), _number(1234567.5)
    ('150', '157.5', '1234567.5')
    """
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


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
