"""Notifications put straight into the outbox and deliveries, as an evaluation commits them.

For delivery tests that need many notifications, or several about one object, without a
source and a watch to make them: the same two staged inserts ``evaluate._commit`` runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta

import polars as pl
from changewatch.channels.base import notification_id_for
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import ensure_delivery_tables
from changewatch.warehouse.statements import render


def enqueue(
    wh: Warehouse, channels: Sequence[str], changes: Sequence[tuple[str, int]], *, at: datetime
) -> list[str]:
    """One notification per ``(object_key, change_id)``, due at ``at`` on each channel; their
    ids in the order given. A change's time is ``at`` plus its change id in milliseconds."""
    ids = [notification_id_for(f"w:src:{key}:{change}") for key, change in changes]
    outbox = pl.DataFrame(
        {
            "notification_id": ids,
            "dedupe_key": [f"w:src:{key}:{change}" for key, change in changes],
            "watch": ["w"] * len(ids),
            "source": ["src"] * len(ids),
            "object_key": [key for key, _ in changes],
            "kind": ["update"] * len(ids),
            "change_id": [change for _, change in changes],
            "title": [f"{key} v{change}" for key, change in changes],
            "body": ["changed"] * len(ids),
            "url": [None] * len(ids),
            "urgency": ["normal"] * len(ids),
            "summary": [None] * len(ids),
            "payload": [json.dumps({"version": change}) for _, change in changes],
            "created_at": [at] * len(ids),
            "due_at": [None] * len(ids),
            "changed_at": [at + timedelta(milliseconds=change) for _, change in changes],
        },
        schema_overrides={
            "url": pl.String,
            "summary": pl.String,
            "due_at": pl.Datetime("us", "UTC"),
            "created_at": pl.Datetime("us", "UTC"),
            "changed_at": pl.Datetime("us", "UTC"),
        },
    )
    deliveries = pl.DataFrame(
        {
            "notification_id": [i for i in ids for _ in channels],
            "channel": [c for _ in ids for c in channels],
            "status": ["pending"] * (len(ids) * len(channels)),
            "next_attempt_at": [at] * (len(ids) * len(channels)),
        },
        schema_overrides={"next_attempt_at": pl.Datetime("us", "UTC")},
    )
    with wh.transaction():
        ensure_delivery_tables(wh)
        with wh.staged("cw_outbox", outbox) as stage:
            wh.execute(render("insert_outbox_staged", wh.dialect, stage=stage))
        with wh.staged("cw_deliveries", deliveries) as stage:
            wh.execute(render("insert_deliveries_staged", wh.dialect, stage=stage))
    return ids
