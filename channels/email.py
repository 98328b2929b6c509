"""Send each notification as an email (plain text with an HTML alternative) over SMTP."""

from __future__ import annotations

import hashlib
import html
import json
import re
from email.message import EmailMessage
from email.utils import format_datetime
from typing import ClassVar

from changewatch.channels.base import Notification, jsonable, safe_link, strip_controls
from changewatch.channels.config import EmailChannelConfig
from changewatch.channels.feedback import links_html
from changewatch.channels.smtp import send_email

__all__ = ["EmailChannel", "build_notification_message", "header_text", "message_id"]

_ID_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_PRIORITY = {"high": ("2", "high"), "urgent": ("1", "high"), "low": ("5", "low")}


def header_text(text: str, limit: int = 200) -> str:
    """`text` fit for a header: one line, no control characters, at most `limit` chars."""
    one_line = " ".join(strip_controls(text).split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def message_id(local: str, from_address: str) -> str:
    """A Message-ID `<local@domain of from_address>`; `local` is hashed if not plain."""
    if not _ID_SAFE.match(local):
        local = hashlib.sha256(local.encode("utf-8")).hexdigest()[:40]
    domain = from_address.rsplit("@", 1)[-1]
    return f"<{local}@{domain}>"


def _text_part(n: Notification) -> str:
    lines = [strip_controls(n.title), ""]
    if n.summary:
        lines += [strip_controls(n.summary).strip(), ""]
    if n.body and n.body.strip() and n.body.strip() != (n.summary or "").strip():
        lines += [strip_controls(n.body).strip(), ""]
    if n.url:
        lines += [strip_controls(n.url).strip(), ""]
    if n.feedback:
        lines += ["Was this worth telling you? Say so (opens a page to confirm):"]
        lines += [f"  {verdict}: {link}" for verdict, link in n.feedback.items()]
        lines += [""]
    lines += [
        "--",
        f"watch:   {strip_controls(n.watch)}",
        f"source:  {strip_controls(n.source)}",
        f"object:  {strip_controls(n.object_key)}",
        f"change:  {strip_controls(n.kind)}",
        f"urgency: {n.urgency}",
        f"at:      {n.created_at.isoformat(timespec='seconds')}",
    ]
    if n.payload:
        details = json.dumps(jsonable(n.payload), indent=2, sort_keys=True, ensure_ascii=False)
        lines += ["", strip_controls(details)]
    return "\n".join(lines) + "\n"


def _html_part(n: Notification) -> str:
    e = html.escape
    title = e(strip_controls(n.title))
    link = safe_link(n.url)
    heading = f'<a href="{e(link)}">{title}</a>' if link else title
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>' + title + "</title></head>",
        '<body style="font-family:sans-serif;max-width:42em">',
        f"<h2>{heading}</h2>",
    ]
    if n.urgency in ("high", "urgent"):
        parts.append(f'<p><strong style="color:#b00">{e(n.urgency.upper())}</strong></p>')
    if n.summary:
        parts.append(f'<p style="white-space:pre-wrap">{e(strip_controls(n.summary).strip())}</p>')
    if n.body and n.body.strip() and n.body.strip() != (n.summary or "").strip():
        parts.append(f'<p style="white-space:pre-wrap">{e(strip_controls(n.body).strip())}</p>')
    if link:
        parts.append(f'<p><a href="{e(link)}">{e(link)}</a></p>')
    if n.feedback:
        parts.append(f"<p>Was this worth telling you? {links_html(n.feedback)}</p>")
    rows = [
        ("watch", n.watch),
        ("source", n.source),
        ("object", n.object_key),
        ("change", n.kind),
        ("urgency", n.urgency),
        ("at", n.created_at.isoformat(timespec="seconds")),
    ]
    parts.append('<table style="color:#555;font-size:90%">')
    parts += [
        f"<tr><th align=left>{e(k)}</th><td>{e(strip_controls(v))}</td></tr>" for k, v in rows
    ]
    parts.append("</table>")
    if n.payload:
        details = json.dumps(jsonable(n.payload), indent=2, sort_keys=True, ensure_ascii=False)
        parts.append(f"<pre>{e(strip_controls(details))}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def build_notification_message(
    notification: Notification, config: EmailChannelConfig
) -> EmailMessage:
    """The email for `notification`: the same notification always gives the same message.

    Message-ID comes from notification_id and Date from created_at, so a retry is
    recognisably the same message (and deduplicated by clients that do).
    """
    n = notification
    msg = EmailMessage()
    prefix = f"[{n.urgency}] " if n.urgency in ("high", "urgent") else ""
    msg["Subject"] = header_text(f"{prefix}{n.watch}: {n.title}")
    msg["From"] = config.from_address
    msg["To"] = ", ".join(config.to)
    msg["Date"] = format_datetime(n.created_at)
    msg["Message-ID"] = message_id(n.notification_id, config.from_address)
    msg["Auto-Submitted"] = "auto-generated"
    msg["X-Changewatch-Watch"] = header_text(n.watch)
    msg["X-Changewatch-Notification-Id"] = header_text(n.notification_id)
    if n.sequence is not None:
        # A filter or a script can tell a late retry from the newest word on the object.
        msg["X-Changewatch-Sequence"] = str(n.sequence)
    if n.urgency in _PRIORITY:
        priority, importance = _PRIORITY[n.urgency]
        msg["X-Priority"] = priority
        msg["Importance"] = importance
    msg.set_content(_text_part(n))
    msg.add_alternative(_html_part(n), subtype="html")
    return msg


class EmailChannel:
    """Sends each notification as one email to the configured recipients."""

    # A mailbox cannot drop a second copy: a send cut short by a crash is never repeated.
    retry_after_crash: ClassVar[bool] = False

    def __init__(self, config: EmailChannelConfig):
        self.name = config.name
        self.config = config

    def send(self, notification: Notification) -> None:
        send_email(build_notification_message(notification, self.config), self.config)
