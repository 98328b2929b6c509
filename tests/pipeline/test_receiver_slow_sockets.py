"""The receiver under slow sockets: a connection holds no thread until its headers are in,
waits for them no longer than header_timeout, and valid deliveries are answered meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from changewatch.pipeline.webhooks.webhook_inbox import Inbox
from changewatch.pipeline.webhooks.webhook_receiver import WebhookReceiver
from test_webhook_receiver import BODY, ENV, SOURCES, github_headers

SLOW = 300
WORKERS = 4


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[WebhookReceiver]:
    inbox = Inbox(tmp_path / "inbox.sqlite")
    with WebhookReceiver(
        SOURCES, inbox=inbox, port=0, environ=ENV, workers=WORKERS, header_timeout=2.0
    ) as server:
        yield server


def open_slow(url: str, count: int) -> list[socket.socket]:
    """``count`` connections that send half a request's headers and then nothing."""
    host, port = url.removeprefix("http://").split(":")
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Len")
        sockets.append(sock)
    return sockets


def closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (a reset too: it had unread bytes of ours)."""
    sock.settimeout(2)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def server_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("changewatch-webhooks"))


def test_valid_deliveries_are_answered_during_slow_sockets(receiver: WebhookReceiver) -> None:
    slow = open_slow(receiver.url, SLOW)
    try:
        waits = []
        with httpx.Client(timeout=5) as client:
            for n in range(20):
                started = time.monotonic()
                answer = client.post(
                    f"{receiver.url}/hooks/gh", content=BODY, headers=github_headers(BODY, f"d{n}")
                )
                waits.append(time.monotonic() - started)
                assert answer.status_code == 202, answer.text
        assert max(waits) < 1.0, waits
        # The selector loop and the workers, not a thread per connection.
        assert server_threads() <= WORKERS + 1
    finally:
        for sock in slow:
            sock.close()


def test_headers_that_do_not_arrive_in_time_end_the_connection(receiver: WebhookReceiver) -> None:
    (sock,) = open_slow(receiver.url, 1)
    started = time.monotonic()
    with sock:
        answer = sock.recv(1024)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer
        assert sock.recv(1024) == b""  # closed
    assert 1.5 < time.monotonic() - started < 4


def test_headers_past_the_limit_are_refused(receiver: WebhookReceiver) -> None:
    (sock,) = open_slow(receiver.url, 1)
    with sock:
        try:
            sock.sendall(b"X-Pad: " + b"a" * (70 << 10))
        except OSError:
            pass  # closed while sending: refused all the same
        assert sock.recv(1024).startswith(b"HTTP/1.1 431")


def test_past_max_connections_the_longest_waiting_is_closed(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.sqlite")
    with WebhookReceiver(
        SOURCES, inbox=inbox, port=0, environ=ENV, max_connections=10, header_timeout=30
    ) as receiver:
        first = open_slow(receiver.url, 10)
        later = open_slow(receiver.url, 5)
        try:
            answer = httpx.post(
                f"{receiver.url}/hooks/gh", content=BODY, headers=github_headers(BODY, "late")
            )
            assert answer.status_code == 202
            # 16 arrived for 10 places: the 6 that waited longest were closed.
            for sock in first[:6]:
                assert closed(sock)
            first[6].settimeout(0.2)
            with pytest.raises(TimeoutError):
                first[6].recv(1)
        finally:
            for sock in first + later:
                sock.close()


def test_a_stalled_body_does_not_hold_up_stopping(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox.sqlite")
    receiver = WebhookReceiver(SOURCES, inbox=inbox, port=0, environ=ENV).start()
    host, port = receiver.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        # Whole headers, then no body: a worker waits for it (30 s between reads).
        sock.sendall(b"POST /hooks/gh HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        time.sleep(0.3)
        assert server_threads() >= 2  # the loop and the waiting worker
        started = time.monotonic()
        receiver.stop()
        assert time.monotonic() - started < 2
