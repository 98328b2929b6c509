"""Print each notification as a compact block on a stream (standard output by default)."""

from __future__ import annotations

import sys
import threading
from typing import ClassVar, TextIO

from changewatch.channels.base import Notification, strip_controls

__all__ = ["ConsoleChannel", "format_console_block"]

# ASCII only: the stream may not be UTF-8 (a C locale, a log file opened as ASCII).
_MARKS = {"low": "-", "normal": "*", "high": "!", "urgent": "!!"}


def _indent(text: str, prefix: str = "    ") -> list[str]:
    return [prefix + line if line else "" for line in strip_controls(text).strip().splitlines()]


def format_console_block(notification: Notification) -> str:
    """The block printed for `notification`: a headline, where it came from, its body, the link."""
    n = notification
    mark = _MARKS.get(n.urgency, "*")
    title = " ".join(strip_controls(n.title).split())
    lines = [
        f"{mark} [{n.urgency}] {title}",
        f"    {strip_controls(n.watch)} | {strip_controls(n.source)} {strip_controls(n.kind)} "
        f"{strip_controls(n.object_key)} | {n.created_at.isoformat(timespec='seconds')}",
    ]
    # The watch's rendered body says what its author wants read (by default the summary);
    # the summary stands in only for a blank body.
    text = n.body if n.body and n.body.strip() else n.summary
    if text and text.strip():
        lines.extend(_indent(text))
    if n.url:
        lines.append("    " + " ".join(strip_controls(n.url).split()))
    return "\n".join(lines) + "\n\n"


class ConsoleChannel:
    """Writes each notification to `stream` (resolved at send time: sys.stdout by default)."""

    # A reader cannot tell a repeated block: a print cut short by a crash is never repeated.
    retry_after_crash: ClassVar[bool] = False

    def __init__(self, name: str, stream: TextIO | None = None):
        self.name = name
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, notification: Notification) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        block = format_console_block(notification)
        with self._lock:
            stream.write(block)
            stream.flush()
