"""Signed feedback links: one per verdict, shown in emails and carried by webhooks.

A link is ``{url}/feedback/{notification_id}/{verdict}?sig=...``, where ``sig`` is the
base64url HMAC-SHA256 of ``{notification_id}:{verdict}`` keyed with the secret from
``feedback.secret_env``. Only the signature travels; the secret stays in the environment of
the processes that sign (delivery) and verify (``changewatch feedback-server``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import os
from collections.abc import Mapping
from urllib.parse import quote

from changewatch.channels.base import safe_link
from changewatch.channels.config import FeedbackConfig

__all__ = [
    "VERDICTS",
    "FeedbackLinks",
    "FeedbackSecretMissing",
    "feedback_key",
    "links_html",
    "feedback_signature",
    "verify_signature",
]

# The verdicts a link records, in the order they are shown.
VERDICTS = ("useful", "noise")


class FeedbackSecretMissing(ValueError):
    """``feedback:`` is configured but its secret's environment variable is not set."""


def feedback_key(config: FeedbackConfig) -> bytes:
    """The signing key from ``$secret_env``; FeedbackSecretMissing names the variable only."""
    secret = os.environ.get(config.secret_env, "")
    if not secret.strip():
        raise FeedbackSecretMissing(
            f"feedback links: environment variable {config.secret_env} (the signing secret) "
            "is not set"
        )
    return secret.encode("utf-8")


def feedback_signature(key: bytes, notification_id: str, verdict: str) -> str:
    """The ``sig`` of one link: base64url HMAC-SHA256 of ``id:verdict``, without padding.

    >>> feedback_signature(b"k", "ntf_1", "useful")
    'm6eqK9lB4RKRPuPN5_xBLShECD5Pi00JWgXjJyiZY5E'
    """
    digest = hmac.new(key, f"{notification_id}:{verdict}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def verify_signature(key: bytes, notification_id: str, verdict: str, sig: str | None) -> bool:
    """Whether ``sig`` is the signature of this link (in constant time).

    >>> key = b"k"
    >>> verify_signature(key, "ntf_1", "useful", feedback_signature(key, "ntf_1", "useful"))
    True
    >>> verify_signature(key, "ntf_1", "noise", feedback_signature(key, "ntf_1", "useful"))
    False
    """
    if not sig:
        return False
    expected = feedback_signature(key, notification_id, verdict)
    return hmac.compare_digest(expected.encode("ascii"), sig.encode("utf-8", "replace"))


class FeedbackLinks:
    """Makes the signed links of notifications (the key is read once, at construction)."""

    def __init__(self, config: FeedbackConfig):
        self._base = config.url.rstrip("/")
        self._key = feedback_key(config)

    def __repr__(self) -> str:
        return f"FeedbackLinks({self._base!r})"  # never the key

    def for_notification(self, notification_id: str) -> dict[str, str]:
        """``{verdict: link}`` for each verdict."""
        path = quote(notification_id, safe="")
        return {
            verdict: f"{self._base}/feedback/{path}/{verdict}"
            f"?sig={feedback_signature(self._key, notification_id, verdict)}"
            for verdict in VERDICTS
        }


def links_html(links: Mapping[str, str]) -> str:
    """The links as HTML anchors named by their verdict, for emails and digests."""
    return " &middot; ".join(
        f'<a href="{html.escape(url)}">{html.escape(verdict)}</a>'
        for verdict, url in links.items()
        if safe_link(url)
    )
