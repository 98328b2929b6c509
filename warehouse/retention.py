"""Retention: what the warehouse forgets once it is old and nothing needs it any more.

The change log, the evaluations and the run records grow with every sync; notifications keep
the content they carried, and the judge's cache the verdicts it was given. ``prune`` deletes
what is past each configured age, under rules that keep every guarantee: nothing a watch has
yet to evaluate, nothing held, the newest change of each log (its id numbers the next sync's
changes), and every notification's dedupe key (only the content of a finished notification is
cleared, so nothing is ever sent twice). Source tables are the current state of the source and
are not pruned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from changewatch.sources.base import Duration, SourceBase
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import (
    changes_table,
    ensure_bookkeeping,
    ensure_delivery_tables,
    ensure_evaluation_tables,
    ensure_source_tables,
)
from changewatch.warehouse.statements import quote, render
from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["PruneStats", "RetentionConfig", "prune"]

# The highest change id there can be: "no watch limits what may go".
_NO_WATERMARK = 2**63 - 1
# A time before any notification: "clear none of them".
_NEVER = datetime(1970, 1, 1, tzinfo=UTC)


class RetentionConfig(BaseModel):
    """How long the warehouse keeps what grows: each age is a duration (``90d``); unset keeps."""

    model_config = ConfigDict(extra="forbid")

    # Change-log entries (and their evaluations), counted from detection (or release).
    changes: Duration | None = Field(
        default=None,
        description=(
            "Age after which change-log entries (and their evaluations) go, from detection."
        ),
    )
    # Records of finished sync runs, counted from their start.
    sync_runs: Duration | None = Field(
        default=None,
        description="Age after which records of finished sync runs go, from their start.",
    )
    # The content (title, body, summary, payload) of notifications whose deliveries are over.
    notifications: Duration | None = Field(
        default=None,
        description=(
            "Age after which the content of notifications whose deliveries are over is cleared "
            "(their dedupe keys stay)."
        ),
    )
    # Cached judge verdicts (their summaries and reasoning), counted from when they came.
    verdicts: Duration | None = Field(
        default=None, description="Age after which cached judge verdicts go."
    )
    # When the Dagster schedule prunes (cron, UTC).
    cron: str = Field(default="30 3 * * *", description="When the Dagster schedule prunes (UTC).")

    @field_validator("changes", "sync_runs", "notifications", "verdicts")
    @classmethod
    def _positive(cls, age: float | None) -> float | None:
        if age is not None and age <= 0:
            raise ValueError("an age to keep must be positive")
        return age

    @property
    def enabled(self) -> bool:
        ages = (self.changes, self.sync_runs, self.notifications, self.verdicts)
        return any(age is not None for age in ages)


@dataclass
class PruneStats:
    """What one prune removed; also materialization metadata."""

    changes: dict[str, int] = field(default_factory=dict)  # source -> change-log entries
    evaluations: int = 0
    sync_runs: int = 0
    notifications_cleared: int = 0
    verdicts: int = 0

    def metadata(self) -> dict[str, Any]:
        return {
            "changes_deleted": sum(self.changes.values()),
            "evaluations_deleted": self.evaluations,
            "sync_runs_deleted": self.sync_runs,
            "notifications_cleared": self.notifications_cleared,
            "verdicts_deleted": self.verdicts,
        } | {f"changes_deleted.{source}": n for source, n in sorted(self.changes.items())}


def prune(
    wh: Warehouse,
    retention: RetentionConfig,
    sources: Sequence[SourceBase],
    watches: Mapping[str, Sequence[str]],
    *,
    digests: Mapping[str, Sequence[str]] | None = None,
    now: datetime | None = None,
) -> PruneStats:
    """Delete what ``retention`` lets go; one transaction, so a failed prune removes nothing.

    ``watches`` maps each source's name to the watches that read it: a change above the
    lowest of their watermarks is kept whatever its age. ``digests`` maps each digest's name
    to its watches: their notifications keep their content until the digest is past them.
    """
    now = now or datetime.now(UTC)
    stats = PruneStats()
    with wh.transaction():
        ensure_bookkeeping(wh)
        ensure_evaluation_tables(wh)
        ensure_delivery_tables(wh)
        if retention.changes is not None:
            cutoff = now - timedelta(seconds=retention.changes)
            for source in sources:
                ensure_source_tables(wh, source)
                changes, evaluations = _prune_changes(
                    wh, source, list(watches.get(source.name, ())), cutoff
                )
                stats.changes[source.name] = changes
                stats.evaluations += evaluations
        if retention.sync_runs is not None:
            cutoff = now - timedelta(seconds=retention.sync_runs)
            stats.sync_runs = len(
                wh.fetch(render("delete_sync_runs_retention", wh.dialect), (cutoff,))
            )
        if retention.notifications is not None:
            cutoff = now - timedelta(seconds=retention.notifications)
            stats.notifications_cleared = _clear_notifications(wh, cutoff, digests or {})
        if retention.verdicts is not None:
            cutoff = now - timedelta(seconds=retention.verdicts)
            stats.verdicts = len(
                wh.fetch(render("delete_judge_cache_retention", wh.dialect), (cutoff,))
            )
            wh.execute(render("delete_judge_prompts_retention", wh.dialect), (cutoff,))
    return stats


def _clear_notifications(
    wh: Warehouse, cutoff: datetime, digests: Mapping[str, Sequence[str]]
) -> int:
    # A digest's notifications keep their content until the digest has gone out past them: a
    # late or backfilled window must not list empty items.
    until: dict[str, datetime] = {}
    for digest, digest_watches in digests.items():
        done = wh.fetch(render("select_window_end_digests", wh.dialect), (digest,))[0][0]
        for watch in digest_watches:
            limit = min(cutoff, done) if done is not None else _NEVER
            until[watch] = min(until.get(watch, cutoff), limit)
    statement = render("update_outbox_retention", wh.dialect)
    cleared = len(wh.fetch(statement, (cutoff, list(until), False)))
    for watch, limit in until.items():
        cleared += len(wh.fetch(statement, (limit, [watch], True)))
    return cleared


def _prune_changes(
    wh: Warehouse, source: SourceBase, watches: list[str], cutoff: datetime
) -> tuple[int, int]:
    """Delete the source's old, settled change-log entries, then their evaluations; counts."""
    watermark = None
    if watches:
        watermark = wh.fetch(
            render("select_watermark_watch_state", wh.dialect), (source.name, watches)
        )[0][0]
    # A watch that has never run starts at the latest sync's changes, so it needs none of the
    # old ones; with no watch run yet, age alone decides.
    limit = _NO_WATERMARK if watermark is None else watermark
    changes = quote(changes_table(source.table))
    deleted = wh.fetch(
        render("delete_changes_retention", wh.dialect, changes=changes),
        (cutoff, limit, source.name, watches, len(watches)),
    )
    evaluations = wh.fetch(
        render("delete_evaluations_retention", wh.dialect, changes=changes), (source.name,)
    )
    return len(deleted), len(evaluations)
