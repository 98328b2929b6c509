"""Debounce: settle the notifications of watches with ``debounce:`` once their window ends.

A debounced notification is queued with its deliveries ``debounced`` until ``due_at``, its
change's detection time plus the watch's debounce. When that has passed, it is settled here,
before delivery (and before digests), by what the change log says:

- a later change of the object that the watch also notified about (or found a duplicate of)
  came within the window: this one is suppressed, "superseded"; the latest of a burst speaks
  for it (the burst: changes notified about, each within the debounce of the one before);
- the object is back where it was before the burst (same content hash, or absent again after
  a create, or recreated identically after a delete) when the window ended: suppressed,
  "flapped back within 10m";
- else released: its deliveries become pending, due at once.

Decisions are keyed by the notification and its window and taken under the watch's
evaluation lock, so a pass repeated, concurrent, or racing an evaluation settles each once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl
from changewatch.evaluators.config import Watch
from changewatch.sources.base import SourceBase
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import (
    changes_table,
    ensure_delivery_tables,
    ensure_evaluation_tables,
)
from changewatch.warehouse.statements import quote, render

__all__ = ["DebounceStats", "format_duration", "settle_debounced"]


@dataclass
class DebounceStats:
    """What one settling pass did."""

    released: int = 0
    suppressed: int = 0
    log: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        return {"debounce_released": self.released, "debounce_suppressed": self.suppressed}


def format_duration(seconds: float) -> str:
    """A duration as the config would spell it.

    >>> format_duration(600), format_duration(90), format_duration(7200), format_duration(0.5)
    ('10m', '90s', '2h', '0.5s')
    """
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def settle_debounced(
    wh: Warehouse,
    watches: Sequence[Watch],
    sources: Mapping[str, SourceBase],
    *,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> DebounceStats:
    """Release or suppress the debounced notifications of ``watches`` whose window has ended.

    ``sources`` maps source names to their settings (for the change logs).
    """
    stats = DebounceStats()
    debounced = [w for w in watches if w.debounce]
    with wh.transaction():
        ensure_evaluation_tables(wh)
        ensure_delivery_tables(wh)
    at = now()
    with wh.transaction():
        dropped = wh.fetch(
            render("update_outbox_debounce_dropped", wh.dialect), (at, [w.name for w in debounced])
        )
        if dropped:
            wh.execute(render("update_deliveries_debounce_dropped", wh.dialect))
            stats.released += len(dropped)
            stats.log.append(f"{len(dropped)} notification(s) released: no debounce any more")
    for watch in debounced:
        for name in watch.sources:
            _settle(wh, watch, sources[name], at, stats)
    return stats


def _settle(
    wh: Warehouse, watch: Watch, source: SourceBase, at: datetime, stats: DebounceStats
) -> None:
    assert watch.debounce
    window = format_duration(watch.debounce)
    statement = render(
        "select_outbox_debounce_due", wh.dialect, changes=quote(changes_table(source.table))
    )
    with wh.transaction():
        # The watch's evaluation lock: an evaluation reviving one of these waits, or goes first.
        wh.lock(f"changewatch:evaluate:{watch.name}")
        params = (watch.name, source.name, at)
        if not wh.fetch(render("count_outbox_debounce_due", wh.dialect), params)[0][0]:
            return
        due = wh.fetch_frame(statement, (watch.name, source.name, watch.debounce, at))
        if due.is_empty():
            return
        superseded = pl.col("superseded_by").is_not_null()
        settled = due.select(
            "notification_id",
            "due_at",
            pl.when(superseded)
            .then(pl.format("superseded by change {} within {}", "superseded_by", pl.lit(window)))
            .when(pl.col("state_hash").eq_missing(pl.col("base_hash")))
            .then(pl.lit(f"flapped back within {window}"))
            .otherwise(pl.lit(None, dtype=pl.String))
            .alias("suppressed"),
            pl.lit(at).cast(pl.Datetime("us", "UTC")).alias("settled_at"),
        )
        with wh.staged("cw_settle", settled) as stage:
            done = {
                r[0]
                for r in wh.fetch(render("update_outbox_settle_staged", wh.dialect, stage=stage))
            }
        settled = settled.filter(pl.col("notification_id").is_in(list(done)))
        with wh.staged("cw_settle", settled) as stage:
            wh.execute(render("update_deliveries_settle_staged", wh.dialect, stage=stage))
    keys = dict(zip(due["notification_id"], due["object_key"], strict=True))
    for notification_id, reason in settled.select("notification_id", "suppressed").iter_rows():
        if reason is None:
            stats.released += 1
        else:
            stats.suppressed += 1
            stats.log.append(
                f"{watch.name}: {source.name} {keys[notification_id]}: suppressed, {reason}"
            )
