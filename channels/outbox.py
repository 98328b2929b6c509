"""From the outbox to people: deliver due notifications, and send each digest window once.

Delivery is a small state machine per (notification, channel) in the ``deliveries`` table:
claimed (committed) before the send, settled after it. A definite failure is retried with
exponential backoff until the attempt limit, then dead-lettered. A send interrupted by a
crash is never retried blindly: it may have arrived, and a notification goes out at most once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
from changewatch.channels.base import Channel, DeliveryError, Notification
from changewatch.channels.build import build_channel
from changewatch.channels.config import ChannelConfig, DigestConfig, EmailChannelConfig
from changewatch.channels.digest import DigestItem, build_digest_message, write_digest_files
from changewatch.channels.smtp import send_email
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import ensure_delivery_tables
from changewatch.warehouse.statements import render

__all__ = [
    "DeliveryPolicy",
    "DeliveryStats",
    "DigestResult",
    "DigestWindowOpen",
    "deliver_due",
    "send_digest_window",
]


@dataclass(frozen=True)
class DeliveryPolicy:
    """Retry schedule: attempt n waits ``base * 2**(n-1)`` (capped) after failure n."""

    max_attempts: int = 6
    backoff_base: timedelta = timedelta(seconds=30)
    backoff_max: timedelta = timedelta(hours=1)
    # A claim older than this belongs to a process that died while sending.
    lease: timedelta = timedelta(minutes=10)

    def next_attempt(self, attempts: int, now: datetime, retry_after: float | None) -> datetime:
        """When to try again after ``attempts`` failures.

        >>> p = DeliveryPolicy()
        >>> start = datetime(2026, 1, 1, tzinfo=UTC)
        >>> [(p.next_attempt(n, start, None) - start).seconds for n in (1, 2, 3)]
        [30, 60, 120]
        """
        wait = min(self.backoff_base * 2 ** (attempts - 1), self.backoff_max)
        if retry_after is not None:
            wait = max(wait, timedelta(seconds=retry_after))
        return now + wait


@dataclass
class DeliveryStats:
    """What one delivery pass did."""

    sent: int = 0
    retrying: int = 0
    dead: int = 0
    interrupted: int = 0
    by_channel: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "retrying": self.retrying,
            "dead_lettered": self.dead,
            "interrupted_sends_parked": self.interrupted,
            "sent_by_channel": json.dumps(self.by_channel, sort_keys=True),
        }


def deliver_due(
    wh: Warehouse,
    channels: Sequence[ChannelConfig],
    *,
    policy: DeliveryPolicy | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    build: Callable[[ChannelConfig], Channel] = build_channel,
) -> DeliveryStats:
    """Send every pending delivery whose time has come; return what happened."""
    policy = policy or DeliveryPolicy()
    stats = DeliveryStats()
    started = now()
    with wh.transaction():
        ensure_delivery_tables(wh)
        parked = wh.fetch(render("update_deliveries_stale", wh.dialect), (started - policy.lease,))
        stats.interrupted = len(parked)
    due = wh.fetch(render("select_deliveries_due", wh.dialect), (started,))
    if not due:
        return stats
    keys = pl.DataFrame(
        {"notification_id": sorted({row[0] for row in due})}, schema={"notification_id": pl.String}
    )
    with wh.staged("cw_due", keys) as stage:
        rows = wh.fetch_frame(render("select_outbox_staged", wh.dialect, stage=stage))
    notifications = {
        row["notification_id"]: _notification(row) for row in rows.iter_rows(named=True)
    }
    configured = {c.name: c for c in channels}
    built: dict[str, Channel] = {}
    for notification_id, channel_name in due:
        with wh.transaction():
            claimed = wh.fetch(
                render("claim_deliveries", wh.dialect), (now(), notification_id, channel_name)
            )
        if not claimed:
            continue  # another deliverer took it
        attempts = claimed[0][0]
        notification = notifications[notification_id]
        status, error, retry_after = "sent", None, None
        try:
            if channel_name not in configured:
                raise DeliveryError(f"channel {channel_name!r} is not configured", retryable=False)
            if channel_name not in built:
                built[channel_name] = build(configured[channel_name])
            built[channel_name].send(notification)
        except DeliveryError as failure:
            error, retry_after = str(failure)[:1000], failure.retry_after
            status = "pending" if failure.retryable and attempts < policy.max_attempts else "dead"
        except Exception as failure:  # noqa: BLE001 - a channel bug must not stop the others
            # The send raised before completing; treat it as a failed, retryable attempt.
            error = f"{type(failure).__name__}: {failure}"[:1000]
            status = "pending" if attempts < policy.max_attempts else "dead"
        finished = now()
        next_attempt = (
            policy.next_attempt(attempts, finished, retry_after)
            if status == "pending"
            else finished
        )
        # Settled one by one: a crash later in the pass leaves these already recorded.
        with wh.transaction():
            wh.execute(
                render("finish_deliveries", wh.dialect),
                (
                    notification_id,
                    channel_name,
                    status,
                    finished if status == "sent" else None,
                    next_attempt,
                    error,
                ),
            )
        if status == "sent":
            stats.sent += 1
            stats.by_channel[channel_name] = stats.by_channel.get(channel_name, 0) + 1
        elif status == "pending":
            stats.retrying += 1
            stats.log.append(
                f"{channel_name}: {notification.title!r} failed (attempt {attempts}), "
                f"retrying at {next_attempt:%H:%M:%S}: {error}"
            )
        else:
            stats.dead += 1
            stats.log.append(f"{channel_name}: {notification.title!r} dead-lettered: {error}")
    return stats


def _notification(row: dict[str, Any]) -> Notification:
    return Notification(
        notification_id=row["notification_id"],
        watch=row["watch"],
        source=row["source"],
        object_key=row["object_key"],
        kind=row["kind"],
        title=row["title"],
        body=row["body"],
        url=row["url"],
        urgency=row["urgency"],
        summary=row["summary"],
        created_at=row["created_at"],
        payload=json.loads(row["payload"]),
    )


class DigestWindowOpen(ValueError):
    """A digest window that has not ended yet was to be sent whole."""


@dataclass
class DigestResult:
    """What one digest window came to."""

    status: str  # sent | written | empty | already_sent | failed
    items: int = 0
    files: tuple[str, ...] = ()
    error: str | None = None
    # The window so far, sent without closing it.
    partial: bool = False

    def metadata(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "items": self.items,
            "files": ", ".join(self.files),
            "error": self.error or "",
            "partial": self.partial,
        }


def send_digest_window(
    wh: Warehouse,
    digest: DigestConfig,
    channel: EmailChannelConfig | None,
    *,
    window_start: datetime,
    window_end: datetime,
    headings: Mapping[str, str] | None = None,
    partial: bool = False,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> DigestResult:
    """Send (and/or write) the digest of ``[window_start, window_end)`` unless already sent.

    Only a window that has ended is sent, and then once: notifications still to come in it
    would otherwise reach no digest (DigestWindowOpen says so). ``partial`` sends the
    notifications so far without recording the window, whose whole digest still goes out
    once it has ended. ``headings`` name the watches' sections (default: their names).
    """
    sent_at = now()
    if partial:
        window_end = min(window_end, sent_at)
    elif window_end > sent_at:
        raise DigestWindowOpen(
            f"digest {digest.name!r}: the window {window_start.isoformat()} to "
            f"{window_end.isoformat()} has not ended, so it is not sent yet (notifications "
            "still to come in it would reach no digest); a partial digest sends the items "
            "so far and leaves it open"
        )
    with wh.transaction():
        ensure_delivery_tables(wh)
    rows = wh.fetch_frame(
        render("select_outbox_window", wh.dialect), (window_start, window_end, list(digest.watches))
    )
    if rows.is_empty() and not digest.send_empty:
        return DigestResult("empty", partial=partial)
    if not partial:
        with wh.transaction():
            claimed = wh.fetch(
                render("claim_digests", wh.dialect),
                (digest.name, window_start, window_end, rows.height, sent_at),
            )
        if not claimed:
            [(sent,)] = wh.fetch(
                render("select_item_count_digests", wh.dialect), (digest.name, window_start)
            )
            return DigestResult("already_sent", items=sent)
    items = [DigestItem.from_notification(_notification(r)) for r in rows.iter_rows(named=True)]
    sender = channel or EmailChannelConfig.model_validate(
        # No SMTP channel: the message is only written to files, addressed for reading.
        {
            "name": "files",
            "type": "email",
            "host": "localhost",
            "from": "changewatch@localhost",
            "to": digest.to or ["digest@localhost"],
        }
    )
    message = build_digest_message(
        digest,
        sender,
        window_start=window_start,
        window_end=window_end,
        items=items,
        sent_at=sent_at,
        headings=headings,
        partial=partial,
    )
    result = DigestResult(
        "written" if channel is None else "sent", items=len(items), partial=partial
    )
    try:
        if digest.output_dir:
            result.files = tuple(str(p) for p in write_digest_files(message, digest.output_dir))
        if channel is not None:
            send_email(message, channel)
    except (DeliveryError, OSError) as failure:
        result.status, result.error = "failed", str(failure)[:1000]
    if partial:
        return result  # nothing recorded: the window stays open for its whole digest
    with wh.transaction():
        wh.execute(
            render("finish_digests", wh.dialect),
            (
                digest.name,
                window_start,
                result.status,
                now() if result.status != "failed" else None,
                message["Message-ID"],
                result.error,
            ),
        )
    return result
