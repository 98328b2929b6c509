"""Table ``rejected_records``: what a ``skip`` source's last sync could not store, and why.

Where it sits: normalization hands the sync its ``Rejection``s (``sources.rejections``); the
sync replaces its source's rows here in the transaction that stores the rest, so the table
always says what the last committed sync left out. The ``no_rejected_records`` asset check
(``pipeline.assets``) reads it back with ``count_rejected``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl
from changewatch.sources.rejections import Rejection, unique
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.statements import render

__all__ = ["count_rejected", "ensure_rejected_records", "replace_rejected"]


def ensure_rejected_records(wh: Warehouse) -> None:
    """Create ``rejected_records`` if it is missing (idempotent)."""
    wh.execute(render("create_rejected_records", wh.dialect))


def replace_rejected(
    wh: Warehouse, source: str, rejected: Sequence[Rejection], *, sync_id: str, at: datetime
) -> None:
    """Make ``rejected`` the rows of ``source``, inside the sync's transaction."""
    wh.execute(render("delete_rejected_records", wh.dialect), (source,))
    rows = unique(rejected)
    if not rows:
        return
    staged = pl.DataFrame(
        {
            "source": [source] * len(rows),
            "record_key": [r.key for r in rows],
            "field": [r.field for r in rows],
            "reason": [r.reason for r in rows],
            "sync_id": [sync_id] * len(rows),
            "rejected_at": [at] * len(rows),
        },
        schema={
            **{k: pl.String for k in ("source", "record_key", "field", "reason", "sync_id")},
            "rejected_at": pl.Datetime("us", "UTC"),
        },
    )
    with wh.staged("cw_rejected", staged) as stage:
        wh.execute(render("insert_rejected_records_staged", wh.dialect, stage=stage))


def count_rejected(wh: Warehouse, source: str) -> tuple[int, str | None]:
    """How many records ``source``'s last sync rejected, and the first one's key."""
    ((count, first),) = wh.fetch(render("count_rejected_records", wh.dialect), (source,))
    return count, first
