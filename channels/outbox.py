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
import random
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
from changewatch.channels.circuit import Circuit, load_circuits, save_circuit
from changewatch.channels.config import (
    ChannelConfig,
    DeliveryConfig,
    DigestConfig,
    EmailChannelConfig,
    FeedbackConfig,
    RetryConfig,
)
from changewatch.channels.digest import DigestItem, build_digest_message, write_digest_files
from changewatch.channels.feedback import FeedbackLinks, FeedbackSecretMissing
from changewatch.channels.recovery import REQUEUED, recover_interrupted
from changewatch.channels.retry import max_attempts
from changewatch.channels.retry import next_attempt as next_attempt_after
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
    "read_notifications",
    "send_digest_window",
]


@dataclass(frozen=True)
class DeliveryPolicy:
    """How a delivery pass works: the retry schedule of the channels without their own, the
    claim lease and the batch sizes."""

    # The schedule of every channel without a `retry:` of its own (channels/retry.py).
    retry: RetryConfig = field(default_factory=RetryConfig)
    # A claim older than this belongs to a process that died while sending (`delivery: lease`).
    lease: timedelta = timedelta(seconds=DeliveryConfig().lease)
    # Deliveries to a file claimed, written and recorded together (one write).
    batch_size: int = 1000
    # Notifications read at a time for the channels that send one by one (each is still
    # claimed and recorded on its own).
    message_batch_size: int = 20
    # The jitter's randomness (a seeded one makes a bench repeatable).
    rng: random.Random | None = field(default=None, compare=False)

    @classmethod
    def from_config(cls, config: DeliveryConfig) -> DeliveryPolicy:
        """The policy the watches file's ``delivery:`` block sets (defaults elsewhere)."""
        return cls(retry=config.retry, lease=timedelta(seconds=config.lease))

    def retry_for(self, channel: ChannelConfig | None) -> RetryConfig:
        """The schedule of ``channel``: its own ``retry:``, else the policy's."""
        own = getattr(channel, "retry", None)
        return own if own is not None else self.retry


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
    # Deliveries due on a paused or disabled channel, left waiting (no send tried).
    held: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "retrying": self.retrying,
            "dead_lettered": self.dead,
            "interrupted_sends_parked": self.interrupted,
            "interrupted_sends_requeued": self.requeued,
            "sent_by_channel": json.dumps(self.by_channel, sort_keys=True),
            "held_by_channel_circuit": json.dumps(self.held, sort_keys=True),
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
    parked (``recovery``). Then deliveries go channel by channel, in the order their changes
    happened: one message at a time, each claimed and recorded in its own transaction, or, to
    a channel with ``send_batch``, in batches claimed, written and recorded together. A
    channel whose circuit is paused or disabled is skipped, or probed with one delivery when
    its probe is due (``circuit``). With ``feedback``, each notification carries its signed
    feedback links; when their secret is not set, every delivery fails saying so.
    """
    policy = policy or DeliveryPolicy()
    stats = DeliveryStats()
    started = now()
    with wh.transaction():
        ensure_delivery_tables(wh)
    attempts = {c.name: max_attempts(policy.retry_for(c)) for c in channels}
    recovered = recover_interrupted(
        wh, channels, lease=policy.lease, max_attempts=attempts, now=started
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
    circuits = load_circuits(wh)
    # Channels in the order their first delivery is due, then the paused ones due a probe.
    names = list(dict.fromkeys(due.get_column("channel").to_list()))
    names += [n for n, c in circuits.items() if c.admits(started) == "probe" and n not in names]
    if not names:
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
    for channel_name in names:
        circuit = circuits.get(channel_name, Circuit(channel_name))
        admits = circuit.admits(started)
        if admits == "none":
            stats.held[channel_name] = due.filter(pl.col("channel") == channel_name).height
            stats.log.append(circuit.line())
            continue
        channel: Channel | Exception | None = unsigned
        if channel_name in configured and unsigned is None:
            try:
                channel = build(configured[channel_name])
            except Exception as failure:  # noqa: BLE001 - counted as each delivery's failure
                channel = failure
        lane = _Lane(
            wh, channel_name, channel, policy.retry_for(configured.get(channel_name)), circuit
        )
        if admits == "probe":
            probe = wh.fetch_frame(render("select_deliveries_probe", wh.dialect), (channel_name,))
            with wh.transaction():
                for notification_id, _ in probe.iter_rows():
                    wh.execute(
                        render("update_deliveries_probe", wh.dialect),
                        (notification_id, channel_name, started),
                    )
            lane.probing = True
            _deliver_rows(lane, probe, links, policy, now, stats)
            lane.probing = False
            if lane.circuit.state != "open":
                continue
            stats.log.append(f"channel {channel_name}: the probe got through; open again")
            rows = wh.fetch_frame(render("select_deliveries_due", wh.dialect), (now(),))
            due_here = rows.filter(pl.col("channel") == channel_name)
        else:
            due_here = due.filter(pl.col("channel") == channel_name)
        _deliver_rows(lane, due_here, links, policy, now, stats)
    return stats


@dataclass
class _Lane:
    """One channel during a pass: where to send, its schedule, and its circuit so far."""

    wh: Warehouse
    name: str
    channel: Channel | Exception | None
    retry: RetryConfig
    circuit: Circuit
    # Sending a paused channel's probe: its failure is the channel's, not the notification's.
    probing: bool = False


def _deliver_rows(
    lane: _Lane,
    rows: pl.DataFrame,
    links: FeedbackLinks | None,
    policy: DeliveryPolicy,
    now: Callable[[], datetime],
    stats: DeliveryStats,
) -> None:
    """Deliver ``rows`` (of one channel) in their order until done or its circuit opens."""
    # A channel that cannot send (unknown, failed to build) fails each delivery at once:
    # in batches, like a file.
    one_by_one = (
        lane.channel
        if isinstance(lane.channel, Channel) and not isinstance(lane.channel, BatchChannel)
        else None
    )
    size = policy.batch_size if one_by_one is None else policy.message_batch_size
    for offset in range(0, rows.height, size):
        notifications = read_notifications(lane.wh, rows.slice(offset, size), links)
        if one_by_one is None:
            _deliver_batch(lane, notifications, policy, now, stats)
        else:
            for notification in notifications:
                _deliver_one(lane, one_by_one, notification, policy, now, stats)
                if lane.circuit.state != "open":
                    break
        if lane.circuit.state != "open":
            stats.log.append(lane.circuit.line())
            return


def read_notifications(
    wh: Warehouse, batch: pl.DataFrame, links: FeedbackLinks | None
) -> list[Notification]:
    """The notifications of ``batch``, in its order."""
    # Read before any claim: a notification that cannot be read stops the pass with nothing
    # of this batch claimed, rather than leaving it to be parked as interrupted.
    with wh.staged("cw_due", batch.select("notification_id")) as stage:
        content = wh.fetch_frame(render("select_outbox_staged", wh.dialect, stage=stage))
    by_id = {
        row["notification_id"]: _notification(row, links) for row in content.iter_rows(named=True)
    }
    return [by_id[i] for i in batch.get_column("notification_id")]


def _advance(lane: _Lane, outcome: Exception | None, at: datetime, policy: DeliveryPolicy) -> bool:
    """Move ``lane``'s circuit past one outcome; whether it changed (and must be written)."""
    before = lane.circuit
    lane.circuit = before.after(outcome, lane.retry, at, policy.rng)
    return lane.circuit != before


def _save(wh: Warehouse, lane: _Lane, before: Circuit) -> None:
    """Write the lane's circuit (in the caller's transaction), reopening the channel's queue
    when it was paused and answers again."""
    save_circuit(wh, lane.circuit, reopened=before.state != "open" and lane.circuit.state == "open")


def _deliver_one(
    lane: _Lane,
    channel: Channel,
    notification: Notification,
    policy: DeliveryPolicy,
    now: Callable[[], datetime],
    stats: DeliveryStats,
) -> None:
    """Claim one delivery, send it, and record its outcome (and the circuit's) at once."""
    wh = lane.wh
    with wh.transaction():
        claimed = wh.fetch(
            render("claim_deliveries", wh.dialect),
            (now(), notification.notification_id, lane.name),
        )
    if not claimed:
        return  # another deliverer took it
    [(attempts, _)] = claimed
    try:
        channel.send(notification)
        outcome: Exception | None = None
    except Exception as failure:  # noqa: BLE001 - a channel bug must not stop the others
        outcome = failure
    finished = now()
    row = _settle(lane, notification, attempts, outcome, finished, policy, stats)
    before = lane.circuit
    changed = _advance(lane, outcome, finished, policy)
    with wh.transaction():
        wh.execute(render("finish_deliveries", wh.dialect), row)
        if changed:
            _save(wh, lane, before)


def _deliver_batch(
    lane: _Lane,
    notifications: list[Notification],
    policy: DeliveryPolicy,
    now: Callable[[], datetime],
    stats: DeliveryStats,
) -> None:
    """Claim ``notifications`` (to one channel), write them at once, and record every outcome."""
    wh, channel_name = lane.wh, lane.name
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
    outcomes = _send_batch(channel_name, lane.channel, batch, resumed)
    finished = now()
    finish: dict[str, list[Any]] = {name: [] for name in _FINISH_SCHEMA}
    before, changed = lane.circuit, False
    for notification, attempts, outcome in zip(
        batch, claimed.get_column("attempts"), outcomes, strict=True
    ):
        row = _settle(lane, notification, attempts, outcome, finished, policy, stats)
        changed = _advance(lane, outcome, finished, policy) or changed
        for name, value in zip(_FINISH_SCHEMA, row, strict=True):
            finish[name].append(value)
    # Recorded per batch: a crash later in the pass leaves this batch already settled.
    with wh.transaction():
        with wh.staged("cw_finish", pl.DataFrame(finish, schema=_FINISH_SCHEMA)) as stage:
            wh.execute(render("finish_deliveries_staged", wh.dialect, stage=stage))
        if changed:
            _save(wh, lane, before)


_FINISH_SCHEMA = {
    "notification_id": pl.String,
    "channel": pl.String,
    "status": pl.String,
    "delivered_at": pl.Datetime("us", "UTC"),
    "next_attempt_at": pl.Datetime("us", "UTC"),
    "last_error": pl.String,
}


def _settle(
    lane: _Lane,
    notification: Notification,
    attempts: int,
    outcome: Exception | None,
    finished: datetime,
    policy: DeliveryPolicy,
    stats: DeliveryStats,
) -> tuple[Any, ...]:
    """The deliveries row (as _FINISH_SCHEMA) for one send's outcome; counted and logged.

    Delivered: sent. A temporary failure: pending until the schedule's next attempt, dead
    once it is spent. A permanent one: dead at once (``redeliver`` can send it again),
    unless it disables the channel (410 Gone): that is the channel's fault, not the
    notification's, so it waits for the channel with the rest; so does a failed probe.
    """
    channel_name = lane.name
    error, retry_after, status = None, None, "sent"
    next_attempt: datetime | None = finished
    if outcome is not None:
        if isinstance(outcome, DeliveryError):
            error, retry_after = str(outcome)[:1000], outcome.retry_after
            retryable = outcome.retryable
        else:
            # The send raised before completing; treat it as a failed, retryable attempt.
            error, retryable = f"{type(outcome).__name__}: {outcome}"[:1000], True
        if isinstance(outcome, DeliveryError) and outcome.disables:
            status = "pending"
        elif retryable and lane.probing:
            # The channel is still down: the notification waits for it, its schedule unspent.
            status = "pending"
        elif retryable:
            next_attempt = next_attempt_after(
                lane.retry,
                attempts,
                finished,
                first=notification.created_at,
                retry_after=retry_after,
                rng=policy.rng,
            )
            status = "dead" if next_attempt is None else "pending"
        else:
            status = "dead"
    next_attempt = next_attempt or finished
    if status == "sent":
        stats.sent += 1
        stats.by_channel[channel_name] = stats.by_channel.get(channel_name, 0) + 1
    elif status == "pending":
        stats.retrying += 1
        stats.log.append(
            f"{channel_name}: {notification.title!r} failed (attempt {attempts}), "
            f"retrying at {next_attempt:%Y-%m-%d %H:%M:%S}: {error}"
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
        sequence=row["change_id"],
        # Notifications queued before ordering have no change time: their creation stands in.
        changed_at=row.get("changed_at") or row["created_at"],
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
