"""Delivery channels (console, JSON-lines file, email, signed webhook, Apprise) and digests."""

from __future__ import annotations

from changewatch.channels.apprise_channel import AppriseChannel
from changewatch.channels.base import (
    URGENCIES,
    Channel,
    DeliveryError,
    Notification,
    notification_id_for,
)
from changewatch.channels.build import build_channel
from changewatch.channels.console import ConsoleChannel
from changewatch.channels.digest import (
    DigestItem,
    DigestParts,
    build_digest_message,
    render_digest,
    write_digest_files,
)
from changewatch.channels.email import EmailChannel, build_notification_message
from changewatch.channels.file import FileChannel
from changewatch.channels.smtp import send_email
from changewatch.channels.webhook import WebhookChannel, sign_webhook

__all__ = [
    "URGENCIES",
    "AppriseChannel",
    "Channel",
    "ConsoleChannel",
    "DeliveryError",
    "DigestItem",
    "DigestParts",
    "EmailChannel",
    "FileChannel",
    "Notification",
    "WebhookChannel",
    "build_channel",
    "build_digest_message",
    "build_notification_message",
    "notification_id_for",
    "render_digest",
    "send_email",
    "sign_webhook",
    "write_digest_files",
]
