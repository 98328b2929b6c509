"""The feedback server: where the signed links of notifications lead.

A GET shows a page with a button and records nothing (mail scanners fetch every link of a
message); the button POSTs, which checks the signature and records the verdict with
``record_feedback``, as ``changewatch feedback`` does. The warehouse is opened per request
and closed after it: a DuckDB file has one writing process at a time, and Dagster runs need
it between clicks. While another process holds it, the answer is 503 with ``Retry-After``.
"""

from __future__ import annotations

import html
import logging
import re
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from changewatch.channels.base import strip_controls
from changewatch.channels.config import FeedbackConfig
from changewatch.channels.feedback import VERDICTS, feedback_key, verify_signature
from changewatch.evaluators.feedback import UnknownNotification, record_feedback
from changewatch.sources.http_server import ThreadedServer
from changewatch.warehouse import WarehouseError, connect

__all__ = ["FeedbackServer"]

log = logging.getLogger(__name__)

_LINK = re.compile(r"^/feedback/([^/]{1,200})/(" + "|".join(VERDICTS) + r")/?$")
_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_MAX_BODY = 16 * 1024
_MAX_NOTE = 500
# Links carry a capability (the signature): no referrer, no caching, no scripts.
_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
}


class FeedbackServer(ThreadedServer):
    """Serves feedback links on ``host:port`` (0 picks a free port) in a background thread.

    ``warehouse_url`` is where feedback is recorded (default: as ``connect()`` chooses).
    Raises FeedbackSecretMissing when the secret is not set, OSError when the port is taken.
    """

    def __init__(
        self,
        config: FeedbackConfig,
        *,
        warehouse_url: str | None = None,
        host: str = "127.0.0.1",
        port: int = 8090,
        retry_after: int = 5,
    ) -> None:
        self.key = feedback_key(config)
        self.warehouse_url = warehouse_url
        self.retry_after = retry_after
        # One recording at a time: a DuckDB file takes one connection of this process.
        self.record_lock = threading.Lock()
        super().__init__(host, port, _Handler, name="changewatch-feedback", log=log)

    def record(self, notification_id: str, verdict: str, note: str | None) -> tuple[int, str]:
        """Record one verdict; the HTTP status and the page's message."""
        with self.record_lock:
            try:
                wh = connect(self.warehouse_url)
            except WarehouseError as error:
                log.warning("feedback for %s not recorded: %s", notification_id, error)
                return 503, "The warehouse is busy right now. Please try again in a moment."
            try:
                watch = record_feedback(wh, notification_id, verdict, note)
            except UnknownNotification:
                return 404, "There is no such notification (any more)."
            except Exception:  # noqa: BLE001 - one failed click must not stop the server
                log.exception("feedback for %s not recorded", notification_id)
                return 500, "Your feedback could not be recorded; the server's log says why."
            finally:
                wh.close()
        log.info("feedback: %s (%s) recorded as %s", notification_id, watch, verdict)
        return 200, f"Thank you: recorded as {verdict} (watch {watch})."


class _Handler(BaseHTTPRequestHandler):
    server_version = "changewatch-feedback/1"
    server: Any  # its .app is the FeedbackServer

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Never the query: it holds the link's signature.
        log.info("%s %s -> %s", self.command, urlsplit(self.path).path, code)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.info(format, *args)

    def _link(self) -> tuple[str, str] | None:
        match = _LINK.match(urlsplit(self.path).path)
        if match is None:
            return None
        notification_id = unquote(match[1])
        return (notification_id, match[2]) if _ID.match(notification_id) else None

    def _query_sig(self) -> str | None:
        return parse_qs(urlsplit(self.path).query).get("sig", [None])[0]

    def do_GET(self) -> None:  # noqa: N802
        link = self._link()
        if link is None:
            self._page(404, "Not found", "This is not a feedback link.")
            return
        notification_id, verdict = link
        sig = self._query_sig()
        if not verify_signature(self.server.app.key, notification_id, verdict, sig):
            self._page(403, "Invalid link", "This link's signature does not match.")
            return
        # A page, not a record: only the button (a POST) records.
        e = html.escape
        form = (
            f'<form method="post" action="{e(urlsplit(self.path).path)}">'
            f'<input type="hidden" name="sig" value="{e(sig or "")}">'
            f'<p><label>Why (optional)<br><textarea name="note" rows="3" cols="40" '
            f'maxlength="{_MAX_NOTE}"></textarea></label></p>'
            f'<p><button type="submit">Record &ldquo;{e(verdict)}&rdquo;</button></p></form>'
        )
        self._page(
            200,
            "Feedback",
            f"Mark notification {notification_id} as {verdict}?",
            extra=form,
        )

    def do_POST(self) -> None:  # noqa: N802
        link = self._link()
        if link is None:
            self._page(404, "Not found", "This is not a feedback link.")
            return
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            self._page(400, "Bad request", "The form is too large.")
            return
        form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
        notification_id, verdict = link
        sig = form.get("sig", [None])[0] or self._query_sig()
        if not verify_signature(self.server.app.key, notification_id, verdict, sig):
            self._page(403, "Invalid link", "This link's signature does not match.")
            return
        note = " ".join(strip_controls(form.get("note", [""])[0]).split())[:_MAX_NOTE] or None
        status, message = self.server.app.record(notification_id, verdict, note)
        headers = {"Retry-After": str(self.server.app.retry_after)} if status == 503 else {}
        self._page(status, "Feedback", message, headers=headers)

    def _page(
        self,
        status: int,
        title: str,
        message: str,
        *,
        extra: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        e = html.escape
        body = (
            "<!DOCTYPE html>\n"
            f'<html><head><meta charset="utf-8"><title>{e(title)}</title></head>'
            '<body style="font-family:sans-serif;max-width:36em">'
            f"<h2>{e(title)}</h2><p>{e(message)}</p>{extra}</body></html>\n"
        ).encode()
        self.send_response(status)
        for name, value in {**_HEADERS, **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
