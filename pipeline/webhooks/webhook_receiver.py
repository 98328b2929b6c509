"""The webhook receiver (`changewatch webhooks`): verify each delivery, store it, then answer.

Each source with ``webhook:`` gets a path. A POST there is read only when it declares a length
within ``max_body_bytes`` (else 413, or 411 without one), checked against the source's secret
and scheme (channels/webhook_signatures.py: a bad or missing signature or a stale timestamp is
401), and only then put in the inbox (pipeline/webhooks/webhook_inbox.py), durably, before the
answer: 202 for a new delivery, 200 for one stored before (a provider's retry), 503 if the inbox
could not be written (the provider tries again). Nothing here touches the warehouse: a DuckDB file
admits one writing process, and the sync runs hold it. The webhook sensor takes it from there.

Secrets come from the environment when the receiver starts and are never logged; neither are
request headers or bodies.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from changewatch.channels.webhook_signatures import (
    DeliveryError,
    SignatureError,
    signing_key,
    verify,
)
from changewatch.pipeline.project.expected_errors import ChangewatchError
from changewatch.pipeline.webhooks.webhook_inbox import INBOX_ERRORS, Inbox
from changewatch.pipeline.webhooks.webhook_inbox_postgres import PostgresInbox
from changewatch.sources.base import SourceBase
from changewatch.sources.http_server import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_WORKERS,
    ThreadedServer,
)
from changewatch.sources.limits import format_size
from changewatch.sources.webhook import WebhookSettings, webhook_provider

__all__ = ["DEFAULT_PORT", "WebhookReceiver", "WebhookSetupError", "webhook_routes"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 8088
# An oversized body is read and dropped up to this much, so the client sees the 413 rather than
# a reset connection; beyond it the connection is simply closed.
_DRAIN_LIMIT = 16 << 20
# Seconds a client may take between two reads of its body (its headers are in by then: see
# evaluators.threaded_server): a stalled sender frees its worker.
_SOCKET_TIMEOUT = 30


class WebhookSetupError(ChangewatchError):
    """The receiver cannot start: no source with ``webhook:``, or a secret missing or bad."""


@dataclass(frozen=True)
class Route:
    """What one path receives: a source's deliveries, checked with its key and scheme."""

    source: str
    provider: str
    settings: WebhookSettings
    key: bytes = field(repr=False)


def webhook_routes(sources: Sequence[SourceBase], environ: Mapping[str, str]) -> dict[str, Route]:
    """Path -> route of every source with ``webhook:``, its secret read from ``environ``.

    Raises WebhookSetupError naming the source and the variable (never the secret)."""
    routes: dict[str, Route] = {}
    for source in sources:
        settings = source.webhook
        if settings is None:
            continue
        where = f"source {source.name!r}: webhook.secret_env"
        secret = environ.get(settings.secret_env, "")
        if not secret.strip():
            raise WebhookSetupError(
                f"{where}: environment variable {settings.secret_env} is not set"
            )
        provider = webhook_provider(source.type, settings)
        try:
            key = signing_key(provider, secret)
        except ValueError as error:
            raise WebhookSetupError(f"{where}: {settings.secret_env}: {error}") from None
        if settings.path in routes:
            other = routes[settings.path].source
            raise WebhookSetupError(
                f"sources {other!r} and {source.name!r} share the webhook path {settings.path}"
            )
        routes[settings.path] = Route(source.name, provider, settings, key)
    if not routes:
        raise WebhookSetupError("no source in the watches file declares `webhook:`")
    return routes


class WebhookReceiver(ThreadedServer):
    """Receives the sources' webhooks on ``host:port`` (0 picks a free port).

    ``environ`` holds the secrets (default: the process environment), ``clock`` the time that
    Standard Webhooks timestamps are checked against. ``workers`` threads answer deliveries
    whose headers are in; a connection gets ``header_timeout`` seconds to send them, and at
    most ``max_connections`` wait for theirs (see ``evaluators.threaded_server``). Raises
    WebhookSetupError for a missing secret, OSError naming the address when the port is taken.
    """

    def __init__(
        self,
        sources: Sequence[SourceBase],
        *,
        inbox: Inbox | PostgresInbox,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        workers: int = DEFAULT_WORKERS,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        import os

        self.routes = webhook_routes(sources, os.environ if environ is None else environ)
        self.inbox = inbox
        self.clock = clock
        super().__init__(
            host,
            port,
            _Handler,
            name="changewatch-webhooks",
            log=log,
            workers=workers,
            header_timeout=header_timeout,
            max_connections=max_connections,
        )

    def receive(self, route: Route, headers: Mapping[str, str], body: bytes) -> tuple[int, dict]:
        """Verify and store one delivery; the HTTP status and a short JSON answer."""
        try:
            verified = verify(
                route.provider,
                route.key,
                headers,
                body,
                now=self.clock(),
                tolerance=route.settings.tolerance,
                signature_header=route.settings.signature_header,
                id_header=route.settings.id_header,
            )
        except SignatureError as error:
            log.warning("webhook for %s refused: %s", route.source, error)
            return 401, {"error": f"not verified: {error}"}
        except DeliveryError as error:
            log.warning("webhook for %s refused: %s", route.source, error)
            return 400, {"error": str(error)}
        if route.provider == "github" and verified.event == "ping":
            # GitHub's hello when a hook is set up: verified, but nothing changed upstream.
            return 200, {"status": "pong"}
        try:
            new = self.inbox.put(
                route.source,
                verified.delivery_id,
                provider=route.provider,
                event=verified.event,
                body=body,
            )
        except INBOX_ERRORS as error:
            where = self.inbox.location
            log.error("webhook for %s not stored (%s): %s", route.source, where, error)
            return 503, {"error": "not stored; try again"}
        log.info(
            "webhook for %s: delivery %s %s",
            route.source,
            verified.delivery_id,
            "stored" if new else "already stored",
        )
        status = "stored" if new else "duplicate"
        return (202 if new else 200), {"status": status, "delivery": verified.delivery_id}


class _Handler(BaseHTTPRequestHandler):
    server_version = "changewatch-webhooks/1"
    timeout = _SOCKET_TIMEOUT
    server: Any  # its .app is the WebhookReceiver

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        log.debug("%s %s -> %s", self.command, urlsplit(self.path).path, code)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug(format, *args)

    def _route(self) -> Route | None:
        return self.server.app.routes.get(urlsplit(self.path).path)

    def do_GET(self) -> None:  # noqa: N802
        if self._route() is None:
            self._answer(404, {"error": "no webhook here"})
        else:
            self._answer(405, {"error": "POST a delivery here"}, {"Allow": "POST"})

    def do_POST(self) -> None:  # noqa: N802
        route = self._route()
        if route is None:
            self._answer(404, {"error": "no webhook here"})
            return
        limit = route.settings.max_body_bytes
        declared = self.headers.get("content-length")
        if declared is None:
            self._answer(411, {"error": "a Content-Length is required"})
            return
        try:
            length = int(declared)
        except ValueError:
            length = -1
        if length < 0:
            self._answer(400, {"error": "bad Content-Length"})
            return
        if length > limit:
            log.warning(
                "webhook for %s refused: %s body, over webhook.max_body_bytes (%s)",
                route.source,
                format_size(length),
                format_size(limit),
            )
            self._drain(length)
            self._answer(413, {"error": f"body over {format_size(limit)} (webhook.max_body_bytes)"})
            return
        body = self.rfile.read(length)
        if len(body) < length:
            return  # the client hung up: nothing to verify, nobody to answer
        headers = {name.lower(): value for name, value in self.headers.items()}
        self._answer(*self.server.app.receive(route, headers, body))

    def _drain(self, length: int) -> None:
        """Read and drop an oversized body, bounded, so the client gets to read the 413."""
        if length > _DRAIN_LIMIT:
            return
        while length > 0 and (chunk := self.rfile.read(min(length, 1 << 16))):
            length -= len(chunk)

    def _answer(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode() + b"\n"
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
