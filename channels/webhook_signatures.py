"""Whether a webhook delivery comes from the provider: checked before anything of it is stored.

Three schemes, each an HMAC-SHA256 over the raw body compared in constant time:

- ``github``: ``X-Hub-Signature-256: sha256=<hex>`` keyed with the secret as given (the
  prefix required, as GitHub always sends it); the delivery id is ``X-GitHub-Delivery``, the
  event ``X-GitHub-Event``.
- ``standard`` (Standard Webhooks): ``webhook-signature: v1,<base64> [v1,<base64>...]`` over
  ``{webhook-id}.{webhook-timestamp}.{body}``, keyed with the base64 part of a ``whsec_``
  secret; a timestamp further than the tolerance from the clock is refused (a replay).
- ``hmac``: a hex digest of the body (``sha256=`` prefix allowed) in a configured header, the
  delivery id in another; a body without one is known by its hash.

GitHub and generic HMAC sign no time: a captured delivery sent again under its own id is a
duplicate (stored once); under a new id it only starts a sync, which changes nothing twice.
No message here holds the secret, a signature or the body.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from changewatch.channels.webhook import decode_secret, sign_webhook

__all__ = ["DeliveryError", "SignatureError", "Verified", "signing_key", "verify"]

# Delivery ids become run keys and log words: printable, no spaces, bounded.
_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


class SignatureError(Exception):
    """The delivery is not verifiably the provider's (answered 401, nothing stored)."""


class DeliveryError(Exception):
    """A signed delivery without a usable delivery id (answered 400, nothing stored)."""


@dataclass(frozen=True)
class Verified:
    """What a verified delivery is known by: its id (the dedupe key) and event type."""

    delivery_id: str
    event: str | None = None


def signing_key(provider: str, secret: str) -> bytes:
    """The HMAC key of ``secret`` under ``provider``'s scheme (ValueError without the secret).

    >>> signing_key("github", "s3cret"), signing_key("standard", "whsec_czNjcmV0")
    (b's3cret', b's3cret')
    """
    if not secret.strip():
        raise ValueError("the webhook secret is empty")
    return decode_secret(secret) if provider == "standard" else secret.encode()


def verify(
    provider: str,
    key: bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance: float = 300.0,
    signature_header: str = "X-Signature-256",
    id_header: str = "X-Delivery-Id",
) -> Verified:
    """The delivery's id and event if ``body`` is signed with ``key``; else SignatureError.

    ``headers`` are keyed in lower case. ``now`` and ``tolerance`` (seconds) bound a Standard
    Webhooks timestamp; ``signature_header`` and ``id_header`` are the ``hmac`` scheme's.

    >>> body = b'{"action": "edited"}'
    >>> mac = hmac.new(b"k", body, hashlib.sha256).hexdigest()
    >>> verify("hmac", b"k", {"x-signature-256": mac, "x-delivery-id": "d1"}, body, now=0)
    Verified(delivery_id='d1', event=None)
    >>> verify("hmac", b"other", {"x-signature-256": mac}, body, now=0)
    Traceback (most recent call last):
    ...
    changewatch.channels.webhook_signatures.SignatureError: the signature does not match
    """
    if provider == "github":
        _check_hex(
            key, body, headers.get("x-hub-signature-256"), "X-Hub-Signature-256", prefix=True
        )
        return Verified(
            _delivery_id(headers.get("x-github-delivery")), headers.get("x-github-event")
        )
    if provider == "standard":
        return _standard(key, headers, body, now=now, tolerance=tolerance)
    if provider == "hmac":
        _check_hex(key, body, headers.get(signature_header.lower()), signature_header)
        given = headers.get(id_header.lower())
        if given is None:
            return Verified("sha256:" + hashlib.sha256(body).hexdigest())
        return Verified(_delivery_id(given))
    raise ValueError(f"unknown webhook provider {provider!r}")


def _check_hex(
    key: bytes, body: bytes, given: str | None, header: str, *, prefix: bool = False
) -> None:
    """``given`` is the hex HMAC of ``body``; with ``prefix`` it must read ``sha256=<hex>``."""
    if not given:
        raise SignatureError(f"no {header} header")
    given = given.strip()
    if prefix and not given.startswith("sha256="):
        # A bare digest is not what GitHub sends: whatever produced it is not GitHub.
        raise SignatureError(f"{header} does not start with sha256=")
    given = given.removeprefix("sha256=")
    expected = hmac.new(key, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), given.lower().encode("ascii", "replace")):
        raise SignatureError("the signature does not match")


def _standard(
    key: bytes, headers: Mapping[str, str], body: bytes, *, now: float, tolerance: float
) -> Verified:
    msg_id, stamp, signatures = (
        headers.get(name) for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
    )
    if not (msg_id and stamp and signatures):
        raise SignatureError("missing webhook-id, webhook-timestamp or webhook-signature")
    if not stamp.isdigit():
        raise SignatureError("webhook-timestamp is not a number of seconds")
    if abs(now - int(stamp)) > tolerance:
        # Signed long ago (or far ahead): a replay, or a clock that needs fixing.
        raise SignatureError(f"webhook-timestamp is more than {tolerance:g}s from this clock")
    expected = sign_webhook(key, msg_id, int(stamp), body).encode()
    # Several signatures may be sent while a sender rotates its secret: any one will do.
    if not any(
        hmac.compare_digest(expected, candidate.encode("ascii", "replace"))
        for candidate in signatures.split()
    ):
        raise SignatureError("the signature does not match")
    return Verified(_delivery_id(msg_id))


def _delivery_id(value: str | None) -> str:
    if value is None or not _ID.match(value):
        raise DeliveryError("no usable delivery id (1-200 printable characters, no spaces)")
    return value
