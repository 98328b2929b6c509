"""The ``poll_schedule`` table: each interval source's polling as the sync sensor decided it.

Where it sits: the sensor decides (pipeline/polling/probe_decisions.py) and passes its decision in a
run tag (pipeline/polling/poll_schedule.py); the run writes it here, so the schedule is visible in
SQL. Rows carry the time of their decision and only a newer one replaces them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.statements import render

__all__ = ["PollRow", "record_poll_schedule"]


@dataclass(frozen=True)
class PollRow:
    """One source's schedule: epoch seconds for the times (``next_due`` None while paused)."""

    source: str
    next_due: float | None
    interval_s: float
    reason: str
    consecutive_failures: int
    paused: bool
    decided_at: float


def _time(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def record_poll_schedule(wh: Warehouse, rows: Iterable[PollRow]) -> int:
    """Upsert ``rows`` (a newer decision wins) in one transaction; how many were given."""
    rows = list(rows)
    if not rows:
        return 0
    written = datetime.now(UTC)
    with wh.transaction():
        # Schema changes serialized, as for the other bookkeeping tables.
        wh.lock("changewatch:ddl")
        wh.execute(render("create_poll_schedule", wh.dialect))
        statement = render("upsert_poll_schedule", wh.dialect)
        for row in rows:  # a run carries a handful: the sources it syncs
            wh.execute(
                statement,
                (
                    row.source,
                    _time(row.next_due),
                    row.interval_s,
                    row.reason,
                    row.consecutive_failures,
                    row.paused,
                    _time(row.decided_at),
                    written,
                ),
            )
    return len(rows)
