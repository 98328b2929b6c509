"""POST each notification as JSON, signed per the Standard Webhooks specification.

Headers: `webhook-id` (the notification id: the same across retries, so receivers can
deduplicate), `webhook-timestamp` (Unix seconds of this attempt) and `webhook-signature`
(`v1,` + base64 HMAC-SHA256 of `{id}.{timestamp}.{body}` keyed with the base64-decoded part
of the `whsec_...` secret). The secret is read from the environment at send time and never
appears in a message or a log; neither do the request headers.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import time
from email.utils import parsedate_to_datetime
from typing import ClassVar
from urllib.parse import urlsplit

import httpx
from changewatch.channels.base import DeliveryError, Notification
from changewatch.channels.config import WebhookChannelConfig
from changewatch.sources.http import tls_context

__all__ = ["WebhookChannel", "decode_secret", "sign_webhook"]

log = logging.getLogger(__name__)

_SECRET_PREFIX = "whsec_"
_USER_AGENT = "changewatch-webhook/1"


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (`whsec_` + base64; the prefix is optional).

    Raises ValueError, whose message does not contain the secret.
    """
    raw = secret.strip()
    if raw.startswith(_SECRET_PREFIX):
        raw = raw[len(_SECRET_PREFIX) :]
    try:
        key = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the webhook secret is not base64 after its whsec_ prefix") from None
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def sign_webhook(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value (`v1,<base64>`) of one message."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


class WebhookChannel:
    """POSTs `notification.to_json()` to a URL; 2xx is delivered."""

    # Every attempt carries the same `webhook-id`, by which the receiver drops a repeat.
    retry_after_crash: ClassVar[bool] = True

    def __init__(self, config: WebhookChannelConfig):
        self.name = config.name
        self.config = config
        # Where we post, for messages: scheme and host only (paths and queries may hold tokens).
        parts = urlsplit(config.url)
        host = parts.netloc.rsplit("@", 1)[-1]
        self._where = f"webhook channel {config.name} ({parts.scheme}://{host})"

    def _key(self) -> bytes | None:
        env = self.config.secret_env
        if env is None:
            return None
        secret = os.environ.get(env)
        if not secret:
            raise DeliveryError(
                f"{self._where}: environment variable {env} (the signing secret) is not set",
                retryable=False,
            )
        try:
            return decode_secret(secret)
        except ValueError as exc:
            raise DeliveryError(f"{self._where}: {env}: {exc}", retryable=False) from None

    def send(self, notification: Notification) -> None:
        key = self._key()
        body = notification.to_json_bytes()
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": _USER_AGENT,
            "webhook-id": notification.notification_id,
            "webhook-timestamp": str(timestamp),
        }
        if key is not None:
            headers["webhook-signature"] = sign_webhook(
                key, notification.notification_id, timestamp, body
            )
        try:
            # The process's TLS context: a client's own would load the CA bundle again, 38 ms
            # of CPU per notification, as much as the rest of a changed source's run.
            with httpx.Client(
                timeout=self.config.timeout, follow_redirects=False, verify=tls_context()
            ) as client:
                response = client.post(self.config.url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise DeliveryError(
                f"{self._where}: timed out ({exc.__class__.__name__})", retryable=True
            ) from None
        except httpx.TransportError as exc:
            # Connection refused or reset, DNS, TLS, protocol errors: the network, not us.
            retryable = not isinstance(exc, httpx.UnsupportedProtocol)
            raise DeliveryError(
                f"{self._where}: {exc.__class__.__name__}: {exc}", retryable=retryable
            ) from None
        except httpx.InvalidURL as exc:
            raise DeliveryError(f"{self._where}: invalid URL: {exc}", retryable=False) from None

        status = response.status_code
        if 200 <= status < 300:
            log.debug(
                "%s: delivered %s (HTTP %s)", self._where, notification.notification_id, status
            )
            return
        # Temporary: timeouts, conflicts, too early, rate limits and server errors. Any other
        # 4xx (or 3xx: redirects are not followed) will not change on a retry.
        retryable = status in _TEMPORARY or status >= 500
        raise DeliveryError(
            f"{self._where}: HTTP {status} {response.reason_phrase}".rstrip(),
            retryable=retryable,
            retry_after=_retry_after(response.headers.get("retry-after")) if retryable else None,
            # 410 Gone: the endpoint was removed; stop sending there until a person says so.
            disables=status == 410,
        )


_TEMPORARY = frozenset({408, 409, 425, 429})
