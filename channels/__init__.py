"""Delivery channels (console, JSON-lines file, email, signed webhook, Apprise) and digests."""

from __future__ import annotations

from channels.apprise_channel import AppriseChannel
from channels.base import (
    URGENCIES,
    Channel,
    DeliveryError,
    Notification,
    notification_id_for,
)
from channels.build import build_channel
from channels.console import ConsoleChannel
from channels.digest import (
    DigestItem,
    DigestParts,
    build_digest_message,
    render_digest,
    write_digest_files,
)
from channels.email import EmailChannel, build_notification_message
from channels.file import FileChannel
from channels.smtp import send_email
from channels.webhook import WebhookChannel, sign_webhook

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
