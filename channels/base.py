"""What every channel delivers (a Notification), how it fails (DeliveryError), and its shape."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

__all__ = [
    "URGENCIES",
    "BatchChannel",
    "Channel",
    "DeliveryError",
    "Notification",
    "ResumableChannel",
    "jsonable",
    "notification_id_for",
    "safe_link",
    "strip_controls",
]

URGENCIES = ("low", "normal", "high", "urgent")

# C0 controls (but tab and newline), DEL and C1 controls: upstream text must not be able to
# drive a terminal (ANSI escapes) or forge extra lines in a header.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def notification_id_for(dedupe_key: str) -> str:
    """The stable id of the notification with this dedupe key: same key, same id, every time.

    It is the Standard Webhooks `webhook-id` and the basis of the email Message-ID, so a
    retry of one notification is recognisably the same message to every receiver.
    """
    return "ntf_" + hashlib.sha256(dedupe_key.encode("utf-8")).hexdigest()[:32]


def strip_controls(text: str) -> str:
    """`text` without control characters other than tab and newline (CR becomes newline)."""
    return _CONTROLS.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))


def safe_link(url: str | None) -> str | None:
    """`url` if it is an absolute http(s) URL fit to be a link, else None (no javascript:...)."""
    if not url:
        return None
    url = url.strip()
    if re.match(r"^https?://[^\s/?#]+", url, re.IGNORECASE) and not re.search(r"[\s<>\"]", url):
        return url
    return None


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data: datetimes in ISO 8601, Decimals as strings, sets sorted.

    Non-finite floats become None (JSON has no NaN). Mapping keys become strings.
    """
    # Plain JSON data first, by exact type: every payload is mostly that, every delivery.
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): jsonable(v) for k, v in value.items()}
    if kind is list:
        return [jsonable(v) for v in value]
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
            return value.isoformat().replace("+00:00", "Z")
        return value.isoformat()
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        items = [jsonable(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=str))
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    return str(value)


@dataclass(frozen=True)
class Notification:
    """One change worth telling someone about, ready for any channel."""

    # Stable id derived from the dedupe key (see notification_id_for): the same across retries.
    notification_id: str
    watch: str
    source: str
    object_key: str
    kind: str
    title: str
    body: str
    url: str | None
    urgency: str
    summary: str | None
    created_at: datetime
    # Extra JSON-able data: changed columns, old/new values... Not part of the hash.
    payload: dict[str, Any] = field(default_factory=dict, hash=False)
    # Signed feedback links ({verdict: url}), added at delivery when `feedback:` is configured;
    # never stored in the outbox.
    feedback: dict[str, str] | None = field(default=None, hash=False)
    # Ordering: the source's change sequence (its change log id: it only grows, so of two
    # notifications about one object the higher is the newer) and when the change was seen.
    # A retry can arrive after a newer notification; a receiver keeps the highest sequence
    # per (source, object_key) and drops a lower one.
    sequence: int | None = None
    changed_at: datetime | None = None

    def __post_init__(self) -> None:
        if not self.notification_id:
            raise ValueError("notification_id must not be empty")
        if self.urgency not in URGENCIES:
            raise ValueError(f"urgency must be one of {URGENCIES}, got {self.urgency!r}")
        if self.created_at.tzinfo is None or self.created_at.utcoffset() is None:
            raise ValueError("created_at must be timezone-aware")

    def to_json(self) -> dict[str, Any]:
        """A stable JSON dict: the same notification always gives the same dict.

        ``feedback`` (the signed links) is there only when the notification carries links;
        ``sequence`` and ``changed_at`` when it has them (every notification from the outbox).
        """
        data: dict[str, Any] = {
            "notification_id": self.notification_id,
            "watch": self.watch,
            "source": self.source,
            "object_key": self.object_key,
            "kind": self.kind,
            "title": self.title,
            "body": self.body,
            "url": self.url,
            "urgency": self.urgency,
            "summary": self.summary,
            "created_at": jsonable(self.created_at),
            "payload": jsonable(self.payload),
        }
        if self.sequence is not None:
            data["sequence"] = self.sequence
        if self.changed_at is not None:
            data["changed_at"] = jsonable(self.changed_at)
        if self.feedback:
            data["feedback"] = dict(self.feedback)
        return data

    def to_json_bytes(self) -> bytes:
        """`to_json()` serialized canonically (sorted keys, compact, UTF-8): stable bytes."""
        return json.dumps(
            self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")


class DeliveryError(Exception):
    """A channel could not deliver a notification.

    `retryable` tells the caller whether trying the same notification again later may work
    (connection refused, 5xx, rate limit) or never will (bad address, 4xx, bad credentials).
    `retry_after` is the receiver's own hint in seconds, when it gave one. `disables` says
    the receiver is gone for good (HTTP 410): its channel is disabled until a person resumes
    it. Messages never contain secrets.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        disables: bool = False,
    ):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.disables = disables

    def __repr__(self) -> str:
        return f"DeliveryError({str(self)!r}, retryable={self.retryable})"


@runtime_checkable
class Channel(Protocol):
    """Somewhere notifications go. `send` returns once delivered or raises DeliveryError.

    A channel class may set ``retry_after_crash = True`` when its receiver recognises a
    repeat (a webhook's `webhook-id`, a file line's notification id): a send interrupted by a
    crash is then sent again (at least once); otherwise it is parked, never repeated (at
    most once). Absent, it is False.
    """

    name: str

    def send(self, notification: Notification) -> None: ...


@runtime_checkable
class BatchChannel(Channel, Protocol):
    """A channel that delivers many notifications at once (one write for a whole batch).

    `send_batch` returns one entry per notification, in order: None once that one is
    delivered, or the DeliveryError it failed with. An exception it raises failed them all.
    """

    def send_batch(self, notifications: Sequence[Notification]) -> list[DeliveryError | None]: ...


@runtime_checkable
class ResumableChannel(Channel, Protocol):
    """A channel that can tell which notifications an interrupted attempt already delivered.

    `already_delivered` gets the notifications whose earlier send was cut short by a crash and
    returns the ids of those that did arrive, so they are recorded as sent, not sent again.
    """

    def already_delivered(self, notifications: Sequence[Notification]) -> set[str]: ...
