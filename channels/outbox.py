"""From the outbox to people: deliver due notifications, and send each digest window once.

Delivery is a small state machine per (notification, channel) in the ``deliveries`` table:
claimed (committed) before the send, settled after it. A definite failure is retried with
exponential backoff until the attempt limit, then dead-lettered. A send interrupted by a
crash is never retried blindly: it may have arrived, and a notification goes out at most once.

Deliveries go in batches per channel: one transaction claims a batch, the channel sends it
(``send_batch`` in one call, else one message at a time), one transaction records every
outcome. A crash between the two leaves the whole batch claimed, and the next pass after the
lease parks all of it as dead, sent or not: the price of two transactions per batch instead
of two per notification, kept small by small batches for channels that send one by one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
from changewatch.channels.base import BatchChannel, Channel, DeliveryError, Notification
from changewatch.channels.build import build_channel
from changewatch.channels.config import (
    ChannelConfig,
    DigestConfig,
    EmailChannelConfig,
    FeedbackConfig,
)
from changewatch.channels.digest import DigestItem, build_digest_message, write_digest_files
from changewatch.channels.feedback import FeedbackLinks, FeedbackSecretMissing
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
    # Deliveries claimed, sent and recorded together. A crash between claim and record parks
    # the whole batch as dead, so channels sending one message at a time (email, webhook...),
    # where a batch saves little next to the sends, get small batches.
    batch_size: int = 1000
    message_batch_size: int = 20

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
    feedback: FeedbackConfig | None = None,
) -> DeliveryStats:
    """Send every pending delivery whose time has come; return what happened.

    Deliveries go channel by channel, in batches: each batch is claimed in one transaction,
    sent (a channel with ``send_batch`` takes it in one call), and its outcomes recorded in
    one transaction. With ``feedback``, each notification carries its signed feedback links;
    when their secret is not set, every delivery fails saying so.
    """
    policy = policy or DeliveryPolicy()
    stats = DeliveryStats()
    started = now()
    with wh.transaction():
        ensure_delivery_tables(wh)
        parked = wh.fetch(render("update_deliveries_stale", wh.dialect), (started - policy.lease,))
        stats.interrupted = len(parked)
    due = wh.fetch_frame(render("select_deliveries_due", wh.dialect), (started,))
    if due.is_empty():
        return stats
    configured = {c.name: c for c in channels}
    links: FeedbackLinks | None = None
    unsigned: DeliveryError | None = None
    if feedback is not None:
        try:
            links = FeedbackLinks(feedback)
        except FeedbackSecretMissing as missing:
            # Like a missing channel secret: sending without the links would hide it.
            unsigned = DeliveryError(str(missing), retryable=False)
    # Channels in the order their first delivery is due; each keeps its deliveries' order.
    for (channel_name,), rows in due.group_by("channel", maintain_order=True):
        channel: Channel | Exception | None = unsigned
        if channel_name in configured and unsigned is None:
            try:
                channel = build(configured[channel_name])
            except Exception as failure:  # noqa: BLE001 - counted as each delivery's failure
                channel = failure
        size = policy.batch_size if isinstance(channel, BatchChannel) else policy.message_batch_size
        for offset in range(0, rows.height, size):
            batch = rows.slice(offset, size)
            _deliver_batch(wh, channel_name, channel, batch, policy, now, stats, links)
    return stats


# What one send came to: None when delivered, the failure, or _UNSENT when handed back unsent.
_UNSENT = object()


def _deliver_batch(
    wh: Warehouse,
    channel_name: str,
    channel: Channel | Exception | None,
    batch: pl.DataFrame,
    policy: DeliveryPolicy,
    now: Callable[[], datetime],
    stats: DeliveryStats,
    links: FeedbackLinks | None = None,
) -> None:
    """Claim ``batch`` (deliveries to one channel), send it, and record every outcome."""
    # Read before the claim: a notification that cannot be read stops the pass with nothing
    # of this batch claimed, rather than parking the batch as interrupted.
    with wh.staged("cw_due", batch.select("notification_id")) as stage:
        content = wh.fetch_frame(render("select_outbox_staged", wh.dialect, stage=stage))
    by_id = {
        row["notification_id"]: _notification(row, links) for row in content.iter_rows(named=True)
    }
    claimed_at = now()
    with wh.transaction():
        # Claims of concurrent deliverers take turns, so their row locks never deadlock.
        wh.lock("changewatch:deliver")
        with wh.staged("cw_claim", batch.select("notification_id", "channel")) as stage:
            claimed = wh.fetch_frame(
                render("claim_deliveries_staged", wh.dialect, stage=stage), (claimed_at,)
            )
    if claimed.is_empty():
        return  # another deliverer took them
    # In due order: RETURNING promises none.
    claimed = batch.select("notification_id").join(
        claimed.select("notification_id", "attempts"), on="notification_id", maintain_order="left"
    )
    notifications = [by_id[i] for i in claimed.get_column("notification_id")]
    deadline = claimed_at + policy.lease / 2
    outcomes, times = _send(channel_name, channel, notifications, deadline, now)

    finish: dict[str, list[Any]] = {name: [] for name in _FINISH_SCHEMA}
    for notification, attempts, outcome, finished in zip(
        notifications, claimed.get_column("attempts"), outcomes, times, strict=True
    ):
        error, retry_after, status = None, None, "sent"
        if outcome is _UNSENT:
            # Never attempted: back to pending as it was before the claim.
            status, attempts = "pending", attempts - 1
        elif isinstance(outcome, DeliveryError):
            error, retry_after = str(outcome)[:1000], outcome.retry_after
            status = "pending" if outcome.retryable and attempts < policy.max_attempts else "dead"
        elif isinstance(outcome, Exception):
            # The send raised before completing; treat it as a failed, retryable attempt.
            error = f"{type(outcome).__name__}: {outcome}"[:1000]
            status = "pending" if attempts < policy.max_attempts else "dead"
        next_attempt = (
            policy.next_attempt(attempts, finished, retry_after)
            if status == "pending" and error is not None
            else finished
        )
        for name, value in zip(
            _FINISH_SCHEMA,
            (
                notification.notification_id,
                channel_name,
                status,
                attempts,
                finished if status == "sent" else None,
                next_attempt,
                error,
                outcome is _UNSENT,
            ),
            strict=True,
        ):
            finish[name].append(value)
        if status == "sent":
            stats.sent += 1
            stats.by_channel[channel_name] = stats.by_channel.get(channel_name, 0) + 1
        elif error is None:
            pass  # handed back unsent; logged once below
        elif status == "pending":
            stats.retrying += 1
            stats.log.append(
                f"{channel_name}: {notification.title!r} failed (attempt {attempts}), "
                f"retrying at {next_attempt:%H:%M:%S}: {error}"
            )
        else:
            stats.dead += 1
            stats.log.append(f"{channel_name}: {notification.title!r} dead-lettered: {error}")
    unsent = sum(outcome is _UNSENT for outcome in outcomes)
    if unsent:
        stats.log.append(
            f"{channel_name}: {unsent} deliveries left for the next pass: their batch reached "
            "half the claim lease"
        )
    # Recorded per batch: a crash later in the pass leaves this batch already settled.
    with wh.transaction():
        with wh.staged("cw_finish", pl.DataFrame(finish, schema=_FINISH_SCHEMA)) as stage:
            wh.execute(render("finish_deliveries_staged", wh.dialect, stage=stage))


_FINISH_SCHEMA = {
    "notification_id": pl.String,
    "channel": pl.String,
    "status": pl.String,
    "attempts": pl.Int32,
    "delivered_at": pl.Datetime("us", "UTC"),
    "next_attempt_at": pl.Datetime("us", "UTC"),
    "last_error": pl.String,
    "handed_back": pl.Boolean,
}


def _send(
    channel_name: str,
    channel: Channel | Exception | None,
    notifications: list[Notification],
    deadline: datetime,
    now: Callable[[], datetime],
) -> tuple[list[Any], list[datetime]]:
    """Each notification's outcome (None, its failure, or _UNSENT) and when it was known."""
    count = len(notifications)
    if channel is None:
        failure = DeliveryError(f"channel {channel_name!r} is not configured", retryable=False)
        return [failure] * count, [now()] * count
    if isinstance(channel, Exception):  # building the channel failed
        return [channel] * count, [now()] * count
    if isinstance(channel, BatchChannel):
        try:
            outcomes: list[Any] = list(channel.send_batch(notifications))
        except Exception as failure:  # noqa: BLE001 - a channel bug must not stop the others
            outcomes = [failure] * count
        return outcomes, [now()] * count
    outcomes, times = [], []
    for notification in notifications:
        # A batch must be recorded well within the lease, or a deliverer starting meanwhile
        # would park the deliveries still to come as interrupted.
        if now() >= deadline:
            outcomes.append(_UNSENT)
        else:
            try:
                channel.send(notification)
                outcomes.append(None)
            except Exception as failure:  # noqa: BLE001 - a channel bug must not stop the others
                outcomes.append(failure)
        times.append(now())
    return outcomes, times


def _notification(row: dict[str, Any], links: FeedbackLinks | None = None) -> Notification:
    # Links are signed here, at each send, so the outbox never holds a link (or the key).
    feedback = links.for_notification(row["notification_id"]) if links is not None else None
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
        feedback=feedback,
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
    feedback: FeedbackConfig | None = None,
) -> DigestResult:
    """Send (and/or write) the digest of ``[window_start, window_end)`` unless already sent.

    Only a window that has ended is sent, and then once: notifications still to come in it
    would otherwise reach no digest (DigestWindowOpen says so). ``partial`` sends the
    notifications so far without recording the window, whose whole digest still goes out
    once it has ended. ``headings`` name the watches' sections (default: their names).
    With ``feedback``, each item carries its signed feedback links; when their secret is not
    set the digest fails saying so, and its window stays unsent.
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
    links: FeedbackLinks | None = None
    if feedback is not None:
        try:
            links = FeedbackLinks(feedback)
        except FeedbackSecretMissing as missing:
            return DigestResult("failed", error=str(missing), partial=partial)
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
    items = [
        DigestItem.from_notification(_notification(r, links)) for r in rows.iter_rows(named=True)
    ]
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
