"""A tiny scriptable HTTP/1.1 server on loopback for connector tests."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit


@dataclass
class Reply:
    """A canned response: status, raw body, headers, and an optional delay before sending."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0

    @classmethod
    def json(cls, data: Any, status: int = 200, **headers: str) -> Reply:
        """A JSON reply; header names use '_' for '-' (``Retry_After="3"``)."""
        extra = {name.replace("_", "-"): value for name, value in headers.items()}
        return cls(status, json.dumps(data).encode(), {"Content-Type": "application/json", **extra})


@dataclass
class Received:
    """One request the server saw: path, query (last value per name) and headers."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]


Handler = Callable[[Received], Reply]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected in tests; anything else is reported.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ApiServer:
    """Serve queued replies (per path, in order) or a handler function; record every request.

    Use as a context manager; ``url(path)`` gives the address. Unscripted paths get a 404.
    """

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._queues: dict[str, deque[Reply]] = defaultdict(deque)
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler_class())
        # A short poll interval keeps shutdown (once per test) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> ApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str = "/") -> str:
        """The full URL of ``path``."""
        return self.base_url + path

    def queue(self, path: str, *replies: Reply) -> None:
        """Answer the next requests to ``path`` with ``replies``, one each, in order."""
        with self._lock:
            self._queues[path].extend(replies)

    def route(self, path: str, handler: Handler) -> None:
        """Answer requests to ``path`` (once its queue is empty) with ``handler(request)``."""
        self._handlers[path] = handler

    def paths(self) -> list[str]:
        """Paths of the requests received, in order."""
        return [r.path for r in self.received]

    def _reply(self, request: Received) -> Reply:
        with self._lock:
            self.received.append(request)
            queue = self._queues.get(request.path)
            if queue:
                return queue.popleft()
        handler = self._handlers.get(request.path)
        if handler is not None:
            return handler(request)
        return Reply.json({"error": f"nothing scripted for {request.path}"}, status=404)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10  # drop idle keep-alive connections so shutdown never hangs

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                request = Received(
                    path=parts.path,
                    query=dict(parse_qsl(parts.query, keep_blank_values=True)),
                    headers={name.lower(): value for name, value in self.headers.items()},
                )
                reply = server._reply(request)
                if reply.delay:
                    time.sleep(reply.delay)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output quiet

        return _Handler
