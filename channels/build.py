"""Turn a channel's configuration into the channel that delivers to it."""

from __future__ import annotations

from changewatch.channels.apprise_channel import AppriseChannel
from changewatch.channels.base import Channel
from changewatch.channels.config import (
    AppriseChannelConfig,
    ConsoleChannelConfig,
    EmailChannelConfig,
    FileChannelConfig,
    WebhookChannelConfig,
)
from changewatch.channels.console import ConsoleChannel
from changewatch.channels.email import EmailChannel
from changewatch.channels.file import FileChannel
from changewatch.channels.webhook import WebhookChannel

__all__ = ["build_channel", "retries_after_crash"]


def build_channel(
    config: ConsoleChannelConfig
    | FileChannelConfig
    | EmailChannelConfig
    | WebhookChannelConfig
    | AppriseChannelConfig,
) -> Channel:
    """The channel for `config`. Secrets are read from the environment at send time."""
    match config:
        case ConsoleChannelConfig():
            return ConsoleChannel(config.name)
        case FileChannelConfig():
            return FileChannel(config.name, config.path)
        case EmailChannelConfig():
            return EmailChannel(config)
        case WebhookChannelConfig():
            return WebhookChannel(config)
        case AppriseChannelConfig():
            return AppriseChannel(config)
    raise TypeError(f"no channel for configuration of type {type(config).__name__}")


_CLASSES: dict[type, type] = {
    ConsoleChannelConfig: ConsoleChannel,
    FileChannelConfig: FileChannel,
    EmailChannelConfig: EmailChannel,
    WebhookChannelConfig: WebhookChannel,
    AppriseChannelConfig: AppriseChannel,
}


def retries_after_crash(config: object) -> bool:
    """Whether a send to this channel cut short by a crash is sent again (see ``Channel``).

    Read from the channel's class, so nothing is built (no secret read) to know it.
    """
    return bool(getattr(_CLASSES.get(type(config)), "retry_after_crash", False))
