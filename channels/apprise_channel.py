"""Send each notification through Apprise: Slack, Discord, Telegram, ntfy, Matrix, JSON...

The Apprise URL embeds the service's token, so it is read from the environment variable
named by `url_env` at send time, and never appears in a message of ours.
"""

from __future__ import annotations

import functools
import os
import warnings
from types import ModuleType
from typing import ClassVar

from changewatch.channels.base import DeliveryError, Notification, strip_controls
from changewatch.channels.config import AppriseChannelConfig

__all__ = ["AppriseChannel", "apprise_text"]


@functools.cache
def _apprise() -> ModuleType:
    """Apprise, with its plugins loaded (lazily: loading them all takes a moment)."""
    with warnings.catch_warnings():
        # Apprise's email plugin imports imghdr, deprecated since Python 3.11.
        warnings.filterwarnings(
            "ignore", message=".*'imghdr' is deprecated", category=DeprecationWarning
        )
        import apprise
        from apprise.plugins import N_MGR

        N_MGR.load_modules()
    return apprise


def apprise_text(notification: Notification) -> tuple[str, str]:
    """(title, body) of the chat message for `notification`."""
    n = notification
    prefix = f"[{n.urgency}] " if n.urgency in ("high", "urgent") else ""
    title = " ".join(strip_controls(f"{prefix}{n.watch}: {n.title}").split())
    lines = []
    text = n.summary if n.summary else n.body
    if text and text.strip():
        lines.append(strip_controls(text).strip())
    lines.append(f"{n.source} {n.kind} {n.object_key}")
    if n.url:
        lines.append(strip_controls(n.url).strip())
    if n.feedback:
        lines.append("\n".join(f"{verdict}: {link}" for verdict, link in n.feedback.items()))
    return title, "\n\n".join(lines)


class AppriseChannel:
    """Notifies the one Apprise URL found in `$url_env`."""

    # Chat services show every copy: a send cut short by a crash is never repeated.
    retry_after_crash: ClassVar[bool] = False

    def __init__(self, config: AppriseChannelConfig):
        self.name = config.name
        self.config = config
        self._where = f"apprise channel {config.name} (${config.url_env})"

    def send(self, notification: Notification) -> None:
        url = os.environ.get(self.config.url_env, "").strip()
        if not url:
            raise DeliveryError(
                f"{self._where}: environment variable {self.config.url_env} is not set",
                retryable=False,
            )
        apprise = _apprise()
        client = apprise.Apprise()
        if not client.add(url):
            raise DeliveryError(
                f"{self._where}: the value is not a URL Apprise supports", retryable=False
            )
        notify_type = (
            apprise.NotifyType.WARNING
            if notification.urgency in ("high", "urgent")
            else apprise.NotifyType.INFO
        )
        title, body = apprise_text(notification)
        with client.notify(
            body=body,
            title=title,
            notify_type=notify_type,
            body_format=apprise.NotifyFormat.TEXT,
            timeout=self.config.timeout,
        ) as result:
            status = result.status
        if status == apprise.AppriseResultStatus.SUCCESS:
            return
        # Apprise does not tell a refused message from an unreachable service: both may pass,
        # so both are retryable, and the caller's attempt limit ends a permanent failure.
        raise DeliveryError(f"{self._where}: delivery {status.name.lower()}", retryable=True)
