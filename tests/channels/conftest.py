"""Real receivers on loopback for the channel tests: an SMTP server (aiosmtpd), an HTTP
receiver (http.server) and a notification factory; the TLS certificate is tests/conftest.py's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from changewatch.channels.base import Notification, notification_id_for

# ---------------------------------------------------------------- notifications


def make_notification(**overrides: Any) -> Notification:
    values: dict[str, Any] = {
        "notification_id": notification_id_for("demo_issues:issues:42:update:7"),
        "watch": "closed_bugs",
        "source": "demo_issues",
        "object_key": "42",
        "kind": "update",
        "title": "Issue #42 closed: crash on start",
        "body": "state: open -> closed",
        "url": "https://tracker.example/issues/42",
        "urgency": "high",
        "summary": "The crash on start was fixed and the issue closed.",
        "created_at": datetime(2024, 5, 2, 6, 30, tzinfo=UTC),
        "payload": {"changed_columns": ["state"], "old": {"state": "open"}},
    }
    values.update(overrides)
    return Notification(**values)


@pytest.fixture
def notification_factory() -> Callable[..., Notification]:
    return make_notification


# ---------------------------------------------------------------- SMTP


@dataclass
class ReceivedMail:
    mail_from: str
    rcpt_tos: list[str]
    content: bytes
    tls: bool
    login: str | None


@dataclass
class SMTPHandler:
    """Accepts mail into `messages`, unless told to answer RCPT or DATA with a reply."""

    messages: list[ReceivedMail] = field(default_factory=list)
    rcpt_reply: str | None = None
    data_reply: str | None = None

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802
        if self.rcpt_reply:
            return self.rcpt_reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        if self.data_reply:
            return self.data_reply
        auth = session.auth_data
        login = auth.login.decode() if isinstance(auth, LoginPassword) else None
        self.messages.append(
            ReceivedMail(
                mail_from=envelope.mail_from,
                rcpt_tos=list(envelope.rcpt_tos),
                content=envelope.original_content or envelope.content,
                tls=session.ssl is not None,
                login=login,
            )
        )
        return "250 Message accepted for delivery"


@dataclass
class Authenticator:
    """Accepts one user and password; records the mechanisms clients used."""

    user: str
    password: str
    mechanisms: list[str] = field(default_factory=list)

    def __call__(self, server, session, envelope, mechanism, auth_data) -> AuthResult:
        self.mechanisms.append(mechanism)
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login.decode() == self.user
            and auth_data.password.decode() == self.password
        )
        return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)


class LoopbackController(Controller):
    """aiosmtpd's Controller on a free port (port=0), which it cannot find out by itself."""

    def _trigger_server(self) -> None:
        assert self.server is not None
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


@dataclass
class SMTPServer:
    handler: SMTPHandler
    controller: LoopbackController
    auth: Authenticator | None = None

    @property
    def port(self) -> int:
        return self.controller.port


@pytest.fixture
def smtp_server() -> Iterator[Callable[..., SMTPServer]]:
    """Start aiosmtpd servers on loopback: `smtp_server(login=(user, password), **SMTP kwargs)`
    (with a login, AUTH is required and only accepts it); all stopped after the test."""
    started: list[LoopbackController] = []

    def start(login: tuple[str, str] | None = None, **kwargs: Any) -> SMTPServer:
        handler = SMTPHandler()
        auth = Authenticator(*login) if login else None
        if auth:
            kwargs.update(authenticator=auth, auth_required=True)
        controller = LoopbackController(handler, hostname="127.0.0.1", port=0, **kwargs)
        controller.start()
        started.append(controller)
        return SMTPServer(handler=handler, controller=controller, auth=auth)

    yield start
    for controller in started:
        controller.stop()


# ---------------------------------------------------------------- HTTP


@dataclass
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HTTPReceiver:
    """Records every request; answers with `responses` in turn, then 200."""

    server: ThreadingHTTPServer
    requests: list[ReceivedRequest] = field(default_factory=list)
    responses: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        return self.server.server_address[1]


def _receiver_handler(receiver: Callable[[], HTTPReceiver]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            rec = receiver()
            with rec.lock:
                rec.requests.append(
                    ReceivedRequest(
                        method=self.command,
                        path=self.path,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=body,
                    )
                )
                status, headers = rec.responses.pop(0) if rec.responses else (200, {})
            payload = b'{"ok": true}' if status < 300 else b'{"error": "nope"}'
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_POST = _handle  # noqa: N815
        do_GET = _handle  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler


@pytest.fixture
def http_receiver() -> Iterator[HTTPReceiver]:
    """An HTTP server on a free loopback port that records requests."""
    holder: list[HTTPReceiver] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _receiver_handler(lambda: holder[0]))
    receiver = HTTPReceiver(server=server)
    holder.append(receiver)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    import socket

    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
