"""Send dead-lettered notifications again, once each, under their original ids.

What ``changewatch redeliver`` does, after the outbox's passes have given up on a delivery
(its schedule spent, or a permanent answer). Each delivery is claimed from 'dead', sent once
(same notification id: same `webhook-id`, same Message-ID), and recorded sent, or dead again
with the new error; it never re-enters the retry schedule. The notification's content is the
outbox's, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl
from changewatch.channels.base import Channel, DeliveryError
from changewatch.channels.build import build_channel
from changewatch.channels.circuit import load_circuits
from changewatch.channels.config import ChannelConfig, FeedbackConfig
from changewatch.channels.feedback import FeedbackLinks
from changewatch.channels.outbox import read_notifications
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import ensure_delivery_tables
from changewatch.warehouse.statements import render

__all__ = ["ChannelDisabled", "Redelivered", "dead_letters", "redeliver"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ChannelDisabled(ValueError):
    """A channel to redeliver to is disabled: it would refuse them all again."""


@dataclass
class Redelivered:
    """What a redelivery did: ids sent, and (id, channel, error) of those that failed again."""

    sent: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)


def dead_letters(
    wh: Warehouse,
    *,
    watch: str | None = None,
    channel: str | None = None,
    since: datetime | None = None,
) -> pl.DataFrame:
    """The dead-lettered deliveries (of ``watch``, to ``channel``, dead since ``since``), in
    the order of their changes: notification_id, channel, watch, object_key, title, dead_at,
    last_error."""
    with wh.transaction():
        ensure_delivery_tables(wh)
    return wh.fetch_frame(
        render("select_deliveries_dead", wh.dialect), (watch or "", channel or "", since or _EPOCH)
    )


def redeliver(
    wh: Warehouse,
    channels: Sequence[ChannelConfig],
    dead: pl.DataFrame,
    *,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    build: Callable[[ChannelConfig], Channel] = build_channel,
    feedback: FeedbackConfig | None = None,
) -> Redelivered:
    """Send each of ``dead`` (rows of ``dead_letters``) once; refuse a disabled channel first."""
    configured = {c.name: c for c in channels}
    circuits = load_circuits(wh)
    for name in dict.fromkeys(dead.get_column("channel").to_list()):
        if name not in configured:
            raise ChannelDisabled(f"channel {name!r} is not in the watches file any more")
        if (circuit := circuits.get(name)) is not None and circuit.state == "disabled":
            raise ChannelDisabled(f"{circuit.line()} (before redelivering to it)")
    links = FeedbackLinks(feedback) if feedback is not None else None
    done = Redelivered()
    built: dict[str, Channel] = {}
    notifications = read_notifications(wh, dead, links)
    for notification, name in zip(notifications, dead.get_column("channel"), strict=True):
        with wh.transaction():
            claimed = wh.fetch(
                render("claim_deliveries_dead", wh.dialect),
                (now(), notification.notification_id, name),
            )
        if not claimed:
            continue  # sent or claimed meanwhile
        error: str | None = None
        try:
            channel = built.get(name) or built.setdefault(name, build(configured[name]))
            channel.send(notification)
        except DeliveryError as failure:
            error = str(failure)[:1000]
        except Exception as failure:  # noqa: BLE001 - one bad send must not stop the rest
            error = f"{type(failure).__name__}: {failure}"[:1000]
        finished = now()
        with wh.transaction():
            wh.execute(
                render("finish_deliveries", wh.dialect),
                (
                    notification.notification_id,
                    name,
                    "sent" if error is None else "dead",
                    finished if error is None else None,
                    finished,
                    error,
                ),
            )
        if error is None:
            done.sent.append((notification.notification_id, name))
        else:
            done.failed.append((notification.notification_id, name, error))
    return done
