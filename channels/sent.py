"""How many notifications were delivered: what ``stop.after_notifications`` counts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import ensure_delivery_tables
from changewatch.warehouse.statements import quote, render

__all__ = ["count_sent"]


def count_sent(wh: Warehouse, by: Literal["watch", "source"], name: str, *, since: float) -> int:
    """Notifications of watch ``name`` (or about source ``name``) delivered on any channel at
    or after ``since`` (epoch seconds); each counts once, however many channels took it."""
    with wh.transaction():
        ensure_delivery_tables(wh)
    statement = render("count_outbox_sent", wh.dialect, column=quote(by))
    [(count,)] = wh.fetch(statement, (name, datetime.fromtimestamp(since, UTC)))
    return int(count)
