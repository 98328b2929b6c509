"""``stop.after_notifications``: after a delivery pass, pause what has been notified enough.

Where it sits: at the end of the ``notifications`` asset, the one step that knows what was
delivered. A source or watch whose delivered notifications (counted since its last resume)
reached its limit is paused in the Dagster instance (pipeline/polling/source_pauses.py), which also
fails its ``not_paused`` check; a source's pause goes to ``poll_schedule`` at once, as this step
holds the warehouse. The sensor then probes the source no more; a paused watch evaluates
nothing (its changes wait for ``changewatch resume``).
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg
from changewatch.channels.sent import count_sent
from changewatch.pipeline.polling.source_pauses import Kind, pause, read_pauses
from changewatch.pipeline.project.watches_file import ChangewatchConfig
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.poll_schedule import PollRow, record_poll_schedule

__all__ = ["apply_notification_stops"]


@dataclass(frozen=True)
class _Limited:
    """A source or watch with ``stop.after_notifications``, and where its check lives."""

    kind: Kind
    name: str
    limit: int
    asset: dg.AssetKey
    interval: float = 0.0


def _limited(config: ChangewatchConfig) -> list[_Limited]:
    from changewatch.pipeline.assets.watch_assets import evaluation_asset_name

    found = [
        _Limited("source", s.name, s.stop.after_notifications, dg.AssetKey(s.table), s.interval)
        for s in config.sources
        if s.stop.after_notifications is not None
    ]
    return found + [
        _Limited("watch", w.name, w.stop.after_notifications, dg.AssetKey(evaluation_asset_name(w)))
        for w in config.watches
        if w.stop.after_notifications is not None
    ]


def apply_notification_stops(
    wh: Warehouse, instance: dg.DagsterInstance, config: ChangewatchConfig, *, now: float
) -> list[str]:
    """Pause each source and watch past its ``stop.after_notifications``; a line for each."""
    limited = _limited(config)
    lines: list[str] = []
    rows: list[PollRow] = []
    for kind in ("source", "watch"):
        mine = [item for item in limited if item.kind == kind]
        records = read_pauses(instance, kind, [item.name for item in mine])
        for item in mine:
            record = records.get(item.name)
            if record is not None and record.paused:
                continue
            since = record.at if record is not None else 0.0  # counted from the last resume
            sent = count_sent(wh, kind, item.name, since=since)
            if sent < item.limit:
                continue
            reason = f"{sent} notifications delivered (stop.after_notifications: {item.limit})"
            pause(instance, kind, item.name, reason, asset=item.asset, now=now)
            lines.append(f"{kind} {item.name}: paused: {reason}")
            if kind == "source":
                rows.append(PollRow(item.name, None, item.interval, reason, 0, True, now))
    record_poll_schedule(wh, rows)
    return lines
