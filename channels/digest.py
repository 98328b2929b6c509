"""Digest emails: the notifications of a time window, grouped by watch, in one message.

render_digest makes the subject, plain text and HTML; build_digest_message wraps them in an
EmailMessage whose Message-ID and Date come from (digest name, window), so sending the same
digest again is recognisably the same message; send_email (the email channel's SMTP path)
sends it, and write_digest_files stores it as .eml and .html when there is no SMTP server.
"""

from __future__ import annotations

import html
import os
import re
import string
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from changewatch.channels.base import Notification, safe_link, strip_controls
from changewatch.channels.config import SUBJECT_FIELDS, DigestConfig, EmailChannelConfig
from changewatch.channels.email import header_text, message_id
from changewatch.channels.smtp import send_email

__all__ = [
    "DigestItem",
    "DigestParts",
    "build_digest_message",
    "digest_message_id",
    "render_digest",
    "send_email",
    "write_digest_files",
]

_STAMP = "%Y%m%dT%H%M%SZ"


@dataclass
class DigestItem:
    """One notification as a digest lists it."""

    watch: str
    title: str
    summary: str | None
    url: str | None
    urgency: str
    created_at: datetime
    object_key: str
    source: str

    @classmethod
    def from_notification(cls, notification: Notification) -> DigestItem:
        n = notification
        return cls(
            watch=n.watch,
            title=n.title,
            summary=n.summary,
            url=n.url,
            urgency=n.urgency,
            created_at=n.created_at,
            object_key=n.object_key,
            source=n.source,
        )


@dataclass(frozen=True)
class DigestParts:
    """A rendered digest: what goes into the email."""

    subject: str
    text: str
    html: str
    count: int


def _zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{timezone!r} is not a known time zone (use e.g. 'Europe/Berlin')"
        ) from None


def _aware(value: datetime, what: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware")
    return value


def _format_subject(template: str, values: dict[str, Any]) -> str:
    """`template` with {count}, {window}... filled in; any other field is an error.

    Only the plain names of SUBJECT_FIELDS are accepted (no `{window.__class__}`).
    """
    out = []
    for literal, field, spec, conversion in string.Formatter().parse(template):
        out.append(literal)
        if field is None:
            continue
        if field not in values:
            raise ValueError(
                f"digest subject: unknown field {{{field}}}; use {', '.join(SUBJECT_FIELDS)}"
            )
        value = values[field]
        if conversion == "r":
            value = repr(value)
        elif conversion in ("s", "a"):
            value = str(value) if conversion == "s" else ascii(value)
        out.append(format(value, spec or ""))
    return header_text("".join(out), limit=250)


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {plural or word + 's'}"


def _grouped(items: Iterable[DigestItem]) -> list[tuple[str, list[DigestItem]]]:
    """Items by watch (watches by name), newest first in each group."""
    groups: dict[str, list[DigestItem]] = {}
    for item in items:
        _aware(item.created_at, "DigestItem.created_at")
        groups.setdefault(item.watch, []).append(item)
    ordered = []
    for watch in sorted(groups):
        group = sorted(groups[watch], key=lambda i: i.object_key)
        group.sort(key=lambda i: i.created_at, reverse=True)
        ordered.append((watch, group))
    return ordered


def _clean(text: str | None) -> str:
    return strip_controls(text or "").strip()


def _one_line(text: str | None) -> str:
    return " ".join(_clean(text).split())


def _render_text(
    name: str, window: str, headline: str, groups: list[tuple[str, list[DigestItem]]], tz: ZoneInfo
) -> str:
    lines = [f"changewatch digest: {name}", window, headline, ""]
    if not groups:
        lines += ["No changes in this window.", ""]
    for watch, group in groups:
        heading = f"{_one_line(watch)} ({_plural(len(group), 'change')})"
        lines += [heading, "=" * len(heading), ""]
        for item in group:
            badge = f"[{item.urgency}] " if item.urgency in ("high", "urgent") else ""
            lines.append(f"* {badge}{_one_line(item.title)}")
            when = item.created_at.astimezone(tz).strftime("%Y-%m-%d %H:%M")
            lines.append(f"  {when} · {_one_line(item.source)} {_one_line(item.object_key)}")
            if item.summary and item.summary.strip():
                lines += ["  " + line for line in _clean(item.summary).splitlines()]
            if item.url:
                lines.append(f"  {_one_line(item.url)}")
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _render_html(
    name: str, window: str, headline: str, groups: list[tuple[str, list[DigestItem]]], tz: ZoneInfo
) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>changewatch digest: {e(_one_line(name))}</title></head>",
        '<body style="font-family:sans-serif;max-width:46em">',
        f"<h1>changewatch digest: {e(_one_line(name))}</h1>",
        f'<p class="window">{e(window)}<br>{e(headline)}</p>',
    ]
    if not groups:
        parts.append("<p>No changes in this window.</p>")
    for watch, group in groups:
        parts.append(
            f'<h2 class="watch">{e(_one_line(watch))} '
            f"<small>({e(_plural(len(group), 'change'))})</small></h2>"
        )
        parts.append("<ul>")
        for item in group:
            title = e(_one_line(item.title))
            link = safe_link(item.url)
            title_html = f'<a href="{e(link)}">{title}</a>' if link else title
            badge = (
                f'<strong style="color:#b00">[{e(item.urgency)}]</strong> '
                if item.urgency in ("high", "urgent")
                else ""
            )
            when = item.created_at.astimezone(tz).strftime("%Y-%m-%d %H:%M")
            meta = f"{when} · {_one_line(item.source)} {_one_line(item.object_key)}"
            parts.append('<li class="item" style="margin-bottom:1em">')
            parts.append(f"{badge}{title_html}<br>")
            parts.append(f'<small style="color:#555">{e(meta)}</small>')
            if item.summary and item.summary.strip():
                parts.append(f'<div style="white-space:pre-wrap">{e(_clean(item.summary))}</div>')
            parts.append("</li>")
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_digest(
    *,
    name: str,
    window_start: datetime,
    window_end: datetime,
    items: list[DigestItem],
    subject_template: str,
    timezone: str,
) -> DigestParts:
    """Subject, plain text and HTML of a digest.

    Items are grouped by watch (watches in name order), newest first in a group, each with
    its summary and link; the header gives the window in `timezone` and the count. Every
    piece of upstream text is escaped in the HTML; only http(s) URLs become links.
    `subject_template` may use {count}, {window}, {name}, {watches}, {start} and {end}.
    """
    tz = _zone(timezone)
    start = _aware(window_start, "window_start").astimezone(tz)
    end = _aware(window_end, "window_end").astimezone(tz)
    groups = _grouped(items)
    count = sum(len(group) for _, group in groups)
    window = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} ({timezone})"
    headline = f"{_plural(count, 'change')} in {_plural(len(groups), 'watch', 'watches')}"
    subject = _format_subject(
        subject_template,
        {
            "count": count,
            "window": window,
            "name": name,
            "watches": len(groups),
            "start": f"{start:%Y-%m-%d %H:%M}",
            "end": f"{end:%Y-%m-%d %H:%M}",
        },
    )
    return DigestParts(
        subject=subject,
        text=_render_text(name, window, headline, groups, tz),
        html=_render_html(name, window, headline, groups, tz),
        count=count,
    )


def digest_message_id(name: str, window_start: datetime, window_end: datetime, sender: str) -> str:
    """The Message-ID of digest `name` for a window: the same for every (re)send of it."""
    start = _aware(window_start, "window_start").astimezone(UTC)
    end = _aware(window_end, "window_end").astimezone(UTC)
    return message_id(f"digest.{name}.{start:{_STAMP}}-{end:{_STAMP}}", sender)


def build_digest_message(
    digest: DigestConfig,
    channel: EmailChannelConfig,
    *,
    window_start: datetime,
    window_end: datetime,
    items: list[DigestItem],
) -> EmailMessage:
    """The digest email: from the channel's sender to `digest.to` (else the channel's `to`)."""
    parts = render_digest(
        name=digest.name,
        window_start=window_start,
        window_end=window_end,
        items=items,
        subject_template=digest.subject,
        timezone=digest.timezone,
    )
    msg = EmailMessage()
    msg["Subject"] = parts.subject
    msg["From"] = channel.from_address
    msg["To"] = ", ".join(digest.to or channel.to)
    msg["Date"] = format_datetime(window_end.astimezone(UTC))
    msg["Message-ID"] = digest_message_id(
        digest.name, window_start, window_end, channel.from_address
    )
    msg["Auto-Submitted"] = "auto-generated"
    msg["X-Changewatch-Digest"] = digest.name
    msg.set_content(parts.text)
    msg.add_alternative(parts.html, subtype="html")
    return msg


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_digest_files(
    message: EmailMessage, directory: str | os.PathLike[str]
) -> tuple[Path, Path]:
    """Store `message` as `<stem>.eml` and its HTML part as `<stem>.html` in `directory`.

    The stem comes from the Message-ID, so writing the same digest again replaces its files.
    Returns (eml_path, html_path).
    """
    html_part = message.get_body(preferencelist=("html",))
    if html_part is None:
        raise ValueError("the message has no HTML part")
    msgid = str(message.get("Message-ID", "")).strip().strip("<>").rsplit("@", 1)[0]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", msgid).strip("._") or "digest"
    out = Path(directory).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    eml_path, html_path = out / f"{stem}.eml", out / f"{stem}.html"
    _write_atomically(eml_path, message.as_bytes())
    _write_atomically(html_path, html_part.get_content().encode("utf-8"))
    return eml_path, html_path
