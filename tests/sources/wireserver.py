"""A loopback HTTP/1.1 server whose routes write raw responses: drips, endless streams, gzip bombs,
redirects with cookies. Records every request (path, query, headers)."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from apiserver import Received

# A route writes the whole response (status line, headers, body) through the handler.
Route = Callable[[BaseHTTPRequestHandler, Received], None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client hanging up on an endless body is the point of these tests


class WireServer:
    """Serve ``routes`` (path -> ``Route``) on a free loopback port; 404 elsewhere."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.received: list[Received] = []
        self._server = _Server(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> WireServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                request = Received(
                    parts.path,
                    dict(parse_qsl(parts.query, keep_blank_values=True)),
                    {name.lower(): value for name, value in self.headers.items()},
                )
                server.received.append(request)
                route = server.routes.get(parts.path)
                if route is None:
                    send(self, 404, b'{"error": "not found"}')
                else:
                    route(self, request)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return _Handler


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    """A whole response with a Content-Length (header names use '_' for '-')."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def json_route(data: Any, **headers: str) -> Route:
    body = json.dumps(data).encode()
    return lambda handler, _request: send(handler, 200, body, **headers)


def redirect_route(location: Callable[[Received], str], **headers: str) -> Route:
    """A 302 to ``location(request)``."""

    def route(handler: BaseHTTPRequestHandler, request: Received) -> None:
        send(handler, 302, b"", Location=location(request), **headers)

    return route


def endless_route(chunk: bytes = b" " * 65536) -> Route:
    """A chunked body that never ends (until the client hangs up)."""

    def route(handler: BaseHTTPRequestHandler, _request: Received) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.wfile.write(b"1\r\n[\r\n")
        frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
        while True:
            handler.wfile.write(frame)

    return route


def drip_route(every: float, content_type: str = "application/json") -> Route:
    """A body announced as 1 GB and sent one byte each ``every`` seconds, for ever."""

    def route(handler: BaseHTTPRequestHandler, _request: Received) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(10**9))
        handler.end_headers()
        handler.wfile.write(b"[")
        handler.wfile.flush()
        while True:
            time.sleep(every)
            handler.wfile.write(b" ")
            handler.wfile.flush()

    return route


def gzip_bomb(inflated: int) -> bytes:
    """A gzip member of ``inflated`` spaces (about a thousandth of that, compressed)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    block = b" " * (1 << 20)
    parts = [packer.compress(block) for _ in range(inflated >> 20)]
    parts.append(packer.flush())
    return b"".join(parts)


def gzip_route(body: bytes) -> Route:
    """``body`` (gzip bytes) served with ``Content-Encoding: gzip``."""
    return lambda handler, _request: send(handler, 200, body, Content_Encoding="gzip")
