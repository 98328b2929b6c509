"""HttpClient over TLS against a real loopback HTTPS server: clients share one TLS context
(sources/http.py tls_context) and every one of them still verifies the server's certificate."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from changewatch.sources.errors import FetchError
from changewatch.sources.http import HttpClient, HttpPolicy, tls_context
from changewatch.sources.ratelimit import RateLimits


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"hello": "world"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_url(tls_files) -> Iterator[str]:
    """An HTTPS server on loopback with a self-signed certificate; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    server.socket = tls_files.server_context().wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/hello"
    finally:
        server.shutdown()
        server.server_close()


def client() -> HttpClient:
    return HttpClient(policy=HttpPolicy(max_retries=0), limits=RateLimits())


def test_every_client_refuses_an_untrusted_certificate(https_url: str) -> None:
    for _ in range(2):  # the second client reuses the first one's context
        with client() as http, pytest.raises(FetchError, match="CERTIFICATE_VERIFY_FAILED"):
            http.get(https_url)
    assert tls_context().verify_mode == ssl.CERT_REQUIRED and tls_context().check_hostname
