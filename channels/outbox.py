"""From the outbox to people: deliver due notifications, and send each digest window once.

Delivery is a small state machine per (notification, channel) in the ``deliveries`` table:
claimed (committed) before the send, settled as soon as the send's outcome is known. A
definite failure is retried with exponential backoff until the attempt limit, then
dead-lettered.

Channels that send one message at a time (email, webhook, apprise, console) claim and record
each message in its own small transaction: the send costs far more. A file channel claims a
batch, appends it in one write and records it in one transaction. A crash thus leaves
'sending' only the message (or the file's batch) in flight; the first pass after the claim
lease (``recovery``) sends it again where the receiver recognises a repeat (webhook, file) and
parks it as dead where it does not (email, apprise, console: at most once).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
from changewatch.channels.base import (
    BatchChannel,
    Channel,
    DeliveryError,
    Notification,
    ResumableChannel,
)
from changewatch.channels.build import build_channel
from changewatch.channels.config import (
    ChannelConfig,
    DeliveryConfig,
    DigestConfig,
    EmailChannelConfig,
    FeedbackConfig,
)
from changewatch.channels.digest import DigestItem, build_digest_message, write_digest_files
from changewatch.channels.feedback import FeedbackLinks, FeedbackSecretMissing
from changewatch.channels.recovery import REQUEUED, recover_interrupted
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
    # A claim older than this belongs to a process that died while sending (`delivery: lease`).
    lease: timedelta = timedelta(seconds=DeliveryConfig().lease)
    # Deliveries to a file claimed, written and recorded together (one write).
    batch_size: int = 1000
    # Notifications read at a time for the channels that send one by one (each is still
    # claimed and recorded on its own).
    message_batch_size: int = 20

    @classmethod
    def from_config(cls, config: DeliveryConfig) -> DeliveryPolicy:
        """The policy the watches file's ``delivery:`` block sets (defaults elsewhere)."""
        return cls(lease=timedelta(seconds=config.lease))

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
    """What one delivery pass did. ``dead`` counts the interrupted sends parked, too."""

    sent: int = 0
    retrying: int = 0
    dead: int = 0
    # Sends cut short by a crash (found past the lease): parked as dead, or sent again.
    interrupted: int = 0
    requeued: int = 0
    # Sends cut short by a crash that had arrived (a file's lines): recorded, not repeated.
    found_delivered: int = 0
    by_channel: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "retrying": self.retrying,
            "dead_lettered": self.dead,
            "interrupted_sends_parked": self.interrupted,
            "interrupted_sends_requeued": self.requeued,
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

    First, sends a crash cut short (claimed longer than the lease ago) are sent again or
    parked (``recovery``). Then deliveries go channel by channel: one message at a time,
    each claimed and recorded in its own transaction, or, to a channel with ``send_batch``,
    in batches claimed, written and recorded together. With ``feedback``, each notification
    carries its signed feedback links; when their secret is not set, every delivery fails
    saying so.
    """
    policy = policy or DeliveryPolicy()
    stats = DeliveryStats()
    started = now()
    with wh.transaction():
        ensure_delivery_tables(wh)
    recovered = recover_interrupted(
        wh, channels, lease=policy.lease, max_attempts=policy.max_attempts, now=started
    )
    for channel_name, count in recovered.requeued.items():
        stats.requeued += count
        stats.log.append(
            f"{channel_name}: {count} send(s) cut short by a crash requeued, to be sent again "
            "(the receiver recognises a repeat)"
        )
    for channel_name, count in recovered.parked.items():
        stats.interrupted += count
        stats.dead += count
        stats.log.append(
            f"{channel_name}: {count} send(s) cut short by a crash dead-lettered, not sent "
            "again (it may have arrived; this channel delivers at most once)"
        )
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
        # A channel that cannot send (unknown, failed to build) fails each delivery at once:
        # in batches, like a file.
        one_by_one = (
            channel
            if isinstance(channel, Channel) and not isinstance(channel, BatchChannel)
            else None
        )
        size = policy.batch_size if one_by_one is None else policy.message_batch_size
        for offset in range(0, rows.height, size):
            batch = rows.slice(offset, size)
            notifications = _read(wh, batch, links)
            if one_by_one is None:
                _deliver_batch(wh, channel_name, channel, notifications, policy, now, stats)
                continue
            for notification in notifications:
                _deliver_one(wh, channel_name, one_by_one, notification, policy, now, stats)
    return stats


def _read(wh: Warehouse, batch: pl.DataFrame, links: FeedbackLinks | None) -> list[Notification]:
    """The notifications of ``batch``, in its order."""
    # Read before any claim: a notification that cannot be read stops the pass with nothing
    # of this batch claimed, rather than leaving it to be parked as interrupted.
    with wh.staged("cw_due", batch.select("notification_id")) as stage:
        content = wh.fetch_frame(render("select_outbox_staged", wh.dialect, stage=stage))
    by_id = {
        row["notification_id"]: _notification(row, links) for row in content.iter_rows(named=True)
    }
    return [by_id[i] for i in batch.get_column("notification_id")]


def _deliver_one(
    wh: Warehouse,
    channel_name: str,
    channel: Channel,
    notification: Notification,
    policy: DeliveryPolicy,
    now: Callable[[], datetime],
    stats: DeliveryStats,
) -> None:
    """Claim one delivery, send it, and record its outcome at once."""
    with wh.transaction():
        claimed = wh.fetch(
            render("claim_deliveries", wh.dialect),
            (now(), notification.notification_id, channel_name),
        )
    if not claimed:
        return  # another deliverer took it
    [(attempts, _)] = claimed
    try:
        channel.send(notification)
        outcome: Exception | None = None
    except Exception as failure:  # noqa: BLE001 - a channel bug must not stop the others
        outcome = failure
    row = _settle(channel_name, notification, attempts, outcome, now(), policy, stats)
    with wh.transaction():
        wh.execute(render("finish_deliveries", wh.dialect), row)


def _deliver_batch(
    wh: Warehouse,
    channel_name: str,
    channel: Channel | Exception | None,
    notifications: list[Notification],
    policy: DeliveryPolicy,
    now: Callable[[], datetime],
    stats: DeliveryStats,
) -> None:
    """Claim ``notifications`` (to one channel), write them at once, and record every outcome."""
    ids = pl.DataFrame(
        {
            "notification_id": [n.notification_id for n in notifications],
            "channel": [channel_name] * len(notifications),
        },
        schema={"notification_id": pl.String, "channel": pl.String},
    )
    claimed_at = now()
    with wh.transaction():
        # Claims of concurrent deliverers take turns, so their row locks never deadlock.
        wh.lock("changewatch:deliver")
        with wh.staged("cw_claim", ids) as stage:
            claimed = wh.fetch_frame(
                render("claim_deliveries_staged", wh.dialect, stage=stage), (claimed_at,)
            )
    if claimed.is_empty():
        return  # another deliverer took them
    # In due order: RETURNING promises none.
    by_id = {n.notification_id: n for n in notifications}
    claimed = ids.select("notification_id").join(
        claimed.select("notification_id", "attempts", "last_error"),
        on="notification_id",
        maintain_order="left",
    )
    batch = [by_id[i] for i in claimed.get_column("notification_id")]
    # A batch whose earlier write a crash cut short: its lines that did arrive are not repeated.
    resumed = [
        n
        for n, error in zip(batch, claimed.get_column("last_error"), strict=True)
        if error == REQUEUED
    ]
    outcomes = _send_batch(channel_name, channel, batch, resumed)
    finished = now()
    finish: dict[str, list[Any]] = {name: [] for name in _FINISH_SCHEMA}
    for notification, attempts, outcome in zip(
        batch, claimed.get_column("attempts"), outcomes, strict=True
    ):
        row = _settle(channel_name, notification, attempts, outcome, finished, policy, stats)
        for name, value in zip(_FINISH_SCHEMA, row, strict=True):
            finish[name].append(value)
    # Recorded per batch: a crash later in the pass leaves this batch already settled.
    with wh.transaction():
        with wh.staged("cw_finish", pl.DataFrame(finish, schema=_FINISH_SCHEMA)) as stage:
            wh.execute(render("finish_deliveries_staged", wh.dialect, stage=stage))


_FINISH_SCHEMA = {
    "notification_id": pl.String,
    "channel": pl.String,
    "status": pl.String,
    "delivered_at": pl.Datetime("us", "UTC"),
    "next_attempt_at": pl.Datetime("us", "UTC"),
    "last_error": pl.String,
}


def _settle(
    channel_name: str,
    notification: Notification,
    attempts: int,
    outcome: Exception | None,
    finished: datetime,
    policy: DeliveryPolicy,
    stats: DeliveryStats,
) -> tuple[Any, ...]:
    """The deliveries row (as _FINISH_SCHEMA) for one send's outcome; counted and logged."""
    error, retry_after, status = None, None, "sent"
    if isinstance(outcome, DeliveryError):
        error, retry_after = str(outcome)[:1000], outcome.retry_after
        status = "pending" if outcome.retryable and attempts < policy.max_attempts else "dead"
    elif outcome is not None:
        # The send raised before completing; treat it as a failed, retryable attempt.
        error = f"{type(outcome).__name__}: {outcome}"[:1000]
        status = "pending" if attempts < policy.max_attempts else "dead"
    next_attempt = (
        policy.next_attempt(attempts, finished, retry_after) if status == "pending" else finished
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
    return (
        notification.notification_id,
        channel_name,
        status,
        finished if status == "sent" else None,
        next_attempt,
        error,
    )


def _send_batch(
    channel_name: str,
    channel: Channel | Exception | None,
    notifications: list[Notification],
    resumed: list[Notification],
) -> list[Exception | None]:
    """Each notification's outcome: None when delivered, else its failure."""
    count = len(notifications)
    if channel is None:
        failure = DeliveryError(f"channel {channel_name!r} is not configured", retryable=False)
        return [failure] * count
    if isinstance(channel, Exception):  # building the channel failed
        return [channel] * count
    try:
        arrived: set[str] = set()
        if resumed and isinstance(channel, ResumableChannel):
            arrived = channel.already_delivered(resumed)
        assert isinstance(channel, BatchChannel), "deliver_due sends the others one by one"
        unsent = [n for n in notifications if n.notification_id not in arrived]
        sent = iter(channel.send_batch(unsent))
        return [None if n.notification_id in arrived else next(sent) for n in notifications]
    except Exception as failure:  # noqa: BLE001 - a channel bug must not stop the others
        return [failure] * count


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
