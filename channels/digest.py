"""Digest emails: the notifications of a time window, grouped by watch, in one message.

render_digest makes the subject, plain text and HTML; build_digest_message wraps them in an
EmailMessage whose Message-ID comes from (digest name, window), so sending the same digest
again is recognisably the same message, and whose Date is when it is sent; send_email (the
email channel's SMTP path) sends it, and write_digest_files stores it as .eml and .html when
there is no SMTP server. A partial digest (a window so far) has a Message-ID of its own.
"""

from __future__ import annotations

import html
import os
import re
import string
import tempfile
from collections.abc import Iterable, Mapping
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
from changewatch.channels.feedback import links_html
from changewatch.channels.smtp import send_email

__all__ = [
    "DigestItem",
    "DigestParts",
    "build_digest_message",
    "digest_message_id",
    "humanize",
    "natural_key",
    "render_digest",
    "send_email",
    "write_digest_files",
]

_STAMP = "%Y%m%dT%H%M%SZ"
# RFC 5322 asks for header lines of at most 78 characters; a longer subject is cut short.
SUBJECT_LIMIT = 77
_PARTIAL = " (so far)"


@dataclass
class DigestItem:
    """One notification as a digest lists it."""

    watch: str
    title: str
    body: str
    url: str | None
    urgency: str
    created_at: datetime
    object_key: str
    source: str
    # Signed feedback links ({verdict: url}) when `feedback:` is configured.
    feedback: dict[str, str] | None = None

    @classmethod
    def from_notification(cls, notification: Notification) -> DigestItem:
        n = notification
        return cls(
            watch=n.watch,
            title=n.title,
            body=n.body,
            url=n.url,
            urgency=n.urgency,
            created_at=n.created_at,
            object_key=n.object_key,
            source=n.source,
            feedback=n.feedback,
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


def humanize(name: str) -> str:
    """A watch's name as a heading.

    >>> humanize("closed_issues")
    'Closed issues'
    """
    words = " ".join(re.split(r"[_\-\s]+", name)).strip()
    return words[:1].upper() + words[1:] if words else name


def natural_key(key: str) -> tuple[tuple[int, int, str], ...]:
    """A sort key for object keys that orders the numbers in them by value.

    >>> sorted(["16", "5", "15", "1"], key=natural_key)
    ['1', '5', '15', '16']
    >>> sorted(["a-10", "b-1", "a-9"], key=natural_key)
    ['a-9', 'a-10', 'b-1']
    """
    parts = re.split(r"([0-9]+)", key)
    return tuple((0, int(p), "") if p.isdigit() and p.isascii() else (1, 0, p) for p in parts if p)


def _format_subject(template: str, values: dict[str, Any], limit: int = SUBJECT_LIMIT) -> str:
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
    return header_text("".join(out), limit=limit)


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {plural or word + 's'}"


def _grouped(items: Iterable[DigestItem]) -> list[tuple[str, list[DigestItem]]]:
    """Items by watch (watches by name), newest first in each group, then by key (#5 < #15)."""
    groups: dict[str, list[DigestItem]] = {}
    for item in items:
        _aware(item.created_at, "DigestItem.created_at")
        groups.setdefault(item.watch, []).append(item)
    return [
        (
            watch,
            sorted(
                groups[watch],
                key=lambda i: (-i.created_at.timestamp(), natural_key(i.object_key)),
            ),
        )
        for watch in sorted(groups)
    ]


def _clean(text: str | None) -> str:
    return strip_controls(text or "").strip()


def _one_line(text: str | None) -> str:
    return " ".join(_clean(text).split())


def _meta(item: DigestItem, tz: ZoneInfo) -> str:
    """When and where; the key only if the title does not already say it."""
    when = item.created_at.astimezone(tz).strftime("%Y-%m-%d %H:%M")
    key, title = _one_line(item.object_key), _one_line(item.title)
    named = re.search(rf"(?<![0-9A-Za-z]){re.escape(key)}(?![0-9A-Za-z])", title)
    return f"{when} · {_one_line(item.source)}" + ("" if named or not key else f" {key}")


def _body(item: DigestItem) -> str:
    """The watch's rendered body, unless it only repeats the title."""
    body = _clean(item.body)
    return "" if _one_line(body) == _one_line(item.title) else body


def _render_text(
    name: str,
    window: str,
    headline: str,
    groups: list[tuple[str, list[DigestItem]]],
    headings: Mapping[str, str],
    tz: ZoneInfo,
) -> str:
    lines = [f"changewatch digest: {name}", window, headline, ""]
    if not groups:
        lines += ["No changes in this window.", ""]
    for watch, group in groups:
        heading = f"{_one_line(headings[watch])} ({_plural(len(group), 'change')})"
        lines += [heading, "=" * len(heading), ""]
        for item in group:
            badge = f"[{item.urgency}] " if item.urgency in ("high", "urgent") else ""
            lines.append(f"* {badge}{_one_line(item.title)}")
            lines.append(f"  {_meta(item, tz)}")
            if body := _body(item):
                lines += ["  " + line for line in body.splitlines()]
            if item.url:
                lines.append(f"  {_one_line(item.url)}")
            for verdict, link in (item.feedback or {}).items():
                lines.append(f"  {verdict}: {link}")
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _render_html(
    name: str,
    window: str,
    headline: str,
    groups: list[tuple[str, list[DigestItem]]],
    headings: Mapping[str, str],
    tz: ZoneInfo,
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
            f'<h2 class="watch">{e(_one_line(headings[watch]))} '
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
            parts.append('<li class="item" style="margin-bottom:1em">')
            parts.append(f"{badge}{title_html}<br>")
            parts.append(f'<small style="color:#555">{e(_meta(item, tz))}</small>')
            if body := _body(item):
                parts.append(f'<div style="white-space:pre-wrap">{e(body)}</div>')
            if item.feedback:
                links = links_html(item.feedback)
                parts.append(f'<br><small style="color:#555">Worth it? {links}</small>')
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
    headings: Mapping[str, str] | None = None,
    partial: bool = False,
) -> DigestParts:
    """Subject, plain text and HTML of a digest.

    Items are grouped by watch (watches in name order), each under its heading (from
    `headings`, else the watch's name made readable), newest first in a group (then by key,
    numbers by value), each with the watch's body and link; the header gives the window in
    `timezone` and the count. Every piece of upstream text is escaped in the HTML; only
    http(s) URLs become links. `subject_template` may use {count}, {window}, {name},
    {watches}, {start}, {end} and {day}; the subject is cut to SUBJECT_LIMIT characters.
    A `partial` digest (the window so far) says so in its subject and header.
    """
    tz = _zone(timezone)
    start = _aware(window_start, "window_start").astimezone(tz)
    end = _aware(window_end, "window_end").astimezone(tz)
    groups = _grouped(items)
    names = {watch: (headings or {}).get(watch) or humanize(watch) for watch, _ in groups}
    count = sum(len(group) for _, group in groups)
    window = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} ({timezone})"
    if partial:
        window += ", so far: the window is still open"
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
            "day": f"{start:%Y-%m-%d}",
        },
        limit=SUBJECT_LIMIT - (len(_PARTIAL) if partial else 0),
    ) + (_PARTIAL if partial else "")
    return DigestParts(
        subject=subject,
        text=_render_text(name, window, headline, groups, names, tz),
        html=_render_html(name, window, headline, groups, names, tz),
        count=count,
    )


def digest_message_id(
    name: str, window_start: datetime, window_end: datetime, sender: str, *, partial: bool = False
) -> str:
    """The Message-ID of digest `name` for a window: the same for every (re)send of it.

    A partial digest's window ends when it was cut, and its id says `partial`, so it is never
    taken for the whole window's digest (nor are its files replaced by that one's).
    """
    start = _aware(window_start, "window_start").astimezone(UTC)
    end = _aware(window_end, "window_end").astimezone(UTC)
    suffix = ".partial" if partial else ""
    return message_id(f"digest.{name}.{start:{_STAMP}}-{end:{_STAMP}}{suffix}", sender)


def build_digest_message(
    digest: DigestConfig,
    channel: EmailChannelConfig,
    *,
    window_start: datetime,
    window_end: datetime,
    items: list[DigestItem],
    sent_at: datetime | None = None,
    headings: Mapping[str, str] | None = None,
    partial: bool = False,
) -> EmailMessage:
    """The digest email: from the channel's sender to `digest.to` (else the channel's `to`).

    Its Date is `sent_at` (default: now), when the message is written, as RFC 5322 asks;
    the window it covers is in the subject and the text.
    """
    parts = render_digest(
        name=digest.name,
        window_start=window_start,
        window_end=window_end,
        items=items,
        subject_template=digest.subject,
        timezone=digest.timezone,
        headings=headings,
        partial=partial,
    )
    msg = EmailMessage()
    msg["Subject"] = parts.subject
    msg["From"] = channel.from_address
    msg["To"] = ", ".join(digest.to or channel.to)
    date = _aware(sent_at, "sent_at") if sent_at is not None else datetime.now(UTC)
    msg["Date"] = format_datetime(date.astimezone(UTC))
    msg["Message-ID"] = digest_message_id(
        digest.name, window_start, window_end, channel.from_address, partial=partial
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
