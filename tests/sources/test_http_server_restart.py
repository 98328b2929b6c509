"""A ThreadedServer killed and started again on its port: it binds at once, though the
connections its predecessor closed still hold the port in TIME_WAIT; a port another server
listens on is still refused (tests/pipeline/test_cli_feedback_server.py)."""

from __future__ import annotations

import logging
import socket
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from changewatch.sources.http_server import ThreadedServer

log = logging.getLogger(__name__)


class Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the server closes each connection first: TIME_WAIT is its

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def server(port: int = 0) -> ThreadedServer:
    return ThreadedServer("127.0.0.1", port, Hello, name="hello", log=log)


def time_wait_on(port: int) -> bool:
    """Whether a TCP socket on 127.0.0.1:``port`` is in TIME_WAIT (state 06 in /proc)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return any(row[1] == f"0100007F:{port:04X}" and row[3] == "06" for row in rows)


def test_a_restarted_server_binds_while_old_connections_wait_and_a_taken_port_fails():
    first = server().start()
    port = int(first.url.rsplit(":", 1)[1])
    for _ in range(3):
        assert httpx.get(first.url, headers={"connection": "close"}).text == "ok"
    first.stop()
    assert time_wait_on(port)  # what made `changewatch webhooks` fail to start again

    with server(port).start() as second:
        assert httpx.get(second.url).text == "ok"
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            server(port)
        with socket.socket() as other:  # nor can a plain socket take it
            with pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
