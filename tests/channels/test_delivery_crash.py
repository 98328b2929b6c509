"""kill -9 in the middle of delivery, on DuckDB and Postgres: what a crash costs per channel.

A real deliverer process (delivery_driver.py) sends to real loopback receivers, which hold
one request open and tell the test, which then SIGKILLs the deliverer: the kill always lands
while a message is in flight, the receiver having seen it. After the claim lease the next
pass recovers it. Webhook and file: every notification arrives, at most one repeat per kill.
Email: at most once, at most one lost per kill.
"""

from __future__ import annotations

import asyncio
import email
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from changewatch.channels.file import FileChannel
from changewatch.channels.outbox import _notification as notification_of
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from patience import reaped
from test_outbox import queue_notifications, statuses

DRIVER = Path(__file__).with_name("delivery_driver.py")
LEASE = 1.0  # seconds: tiny, so the test waits little for a crashed claim to expire
KILLS = 3
# A cap for the wait on a deliverer's progress, only there to fail a stuck test; the wait
# itself ends on the receiver's signal.
STUCK = 120.0


class Hold:
    """Counts what a receiver got; holds the request numbered `at` open until `release`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[str] = []
        self.at: int | None = None
        self.held = threading.Event()
        self.release = threading.Event()

    def due(self) -> bool:
        """Whether the next arrival is the one to hold."""
        with self.lock:
            return len(self.seen) + 1 == self.at

    def arrive(self, key: str | None) -> None:
        """Record an arrival (None: one that does not count as arrived)."""
        with self.lock:
            if key is not None:
                self.seen.append(key)

    def hold(self) -> None:
        """Tell the test, and keep the request open until it says."""
        self.held.set()
        self.release.wait(STUCK)

    def arm(self, after: int) -> None:
        """Hold the request `after` more arrivals from now."""
        with self.lock:
            self.at = len(self.seen) + after
            self.held.clear()
            self.release.clear()

    def disarm(self) -> None:
        with self.lock:
            self.at = None
        self.release.set()


@pytest.fixture
def webhook_hold() -> Iterator[tuple[Hold, str]]:
    """A loopback webhook receiver that records each `webhook-id` (held ones too: they
    arrived) and answers 200."""
    hold = Hold()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length") or 0))
            held = hold.due()
            hold.arrive(self.headers["webhook-id"])
            if held:
                hold.hold()
                return  # the deliverer is dead by now: no answer
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield hold, f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        hold.disarm()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class _Controller(Controller):
    def _trigger_server(self) -> None:
        assert self.server is not None
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


@pytest.fixture
def smtp_hold() -> Iterator[tuple[Hold, int]]:
    """A loopback SMTP server that records each message's Message-ID; a held message is
    not accepted (its sender dies waiting), so it never arrives."""
    hold = Hold()

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
            message = email.message_from_bytes(envelope.original_content or envelope.content)
            if hold.due():
                # Waits off the event loop; the sender is killed meanwhile.
                await asyncio.get_running_loop().run_in_executor(None, hold.hold)
                return "451 not accepted"
            hold.arrive(message["Message-ID"])
            return "250 OK"

    controller = _Controller(Handler(), hostname="127.0.0.1", port=0)
    controller.start()
    try:
        yield hold, controller.port
    finally:
        hold.disarm()
        controller.stop()


def run_driver(url: str, channels: list[dict[str, Any]], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(DRIVER), url, json.dumps(channels), str(LEASE), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_while_held(url: str, channels: list[dict[str, Any]], hold: Hold, after: int) -> None:
    """Start a deliverer, SIGKILL it while the receiver holds its `after`-th send open, and
    wait out the claim lease."""
    hold.arm(after)
    proc = run_driver(url, channels)
    give_up = time.monotonic() + STUCK
    try:
        while not hold.held.wait(0.05):
            if proc.poll() is not None:
                _, err = proc.communicate()
                pytest.fail(f"the deliverer ended before the hold: {err}")
            assert time.monotonic() < give_up, "the deliverer made no progress"
    finally:
        proc.kill()
        proc.communicate()
        killed = time.monotonic()
        hold.disarm()
    # Its claim was made before the kill: past the lease from now, a new pass recovers it.
    time.sleep(max(0.0, LEASE - (time.monotonic() - killed)) + 0.05)


def finish(url: str, channels: list[dict[str, Any]]) -> str:
    """A last, uninterrupted pass; what it printed."""
    with reaped([run_driver(url, channels)]) as (proc,):  # killed if the wait is cut short
        out, err = proc.communicate(timeout=STUCK)
    assert proc.returncode == 0, err
    return out


def outbox_ids(url: str) -> set[str]:
    with connect(url) as wh:
        return {i for (i,) in wh.fetch("SELECT notification_id FROM outbox")}


@pytest.mark.e2e  # kill tests: a deliverer process SIGKILLed three times
def test_kill_9_during_webhook_delivery_loses_none_and_repeats_at_most_one_per_kill(
    warehouse_url: str, demo_api: DemoAPIServer, webhook_hold: tuple[Hold, str]
) -> None:
    hold, hook_url = webhook_hold
    queue_notifications(warehouse_url, demo_api, ["hook"], count=20)
    channels = [{"name": "hook", "type": "webhook", "url": hook_url}]
    for _ in range(KILLS):
        kill_while_held(warehouse_url, channels, hold, after=5)
    last = finish(warehouse_url, channels)

    received = Counter(hold.seen)
    assert set(received) == outbox_ids(warehouse_url)  # none lost
    assert max(received.values()) <= 2
    repeats = sum(received.values()) - len(received)
    assert 0 < repeats <= KILLS
    assert {s for _, s, _ in statuses(warehouse_url)} == {"sent"}
    # The pass after the last kill says what it sent again.
    assert "1 requeued after a crash" in last, last


@pytest.mark.e2e  # kill tests: a deliverer process SIGKILLed three times
def test_kill_9_during_email_delivery_sends_none_twice_and_loses_at_most_one_per_kill(
    warehouse_url: str, demo_api: DemoAPIServer, smtp_hold: tuple[Hold, int]
) -> None:
    hold, port = smtp_hold
    queue_notifications(warehouse_url, demo_api, ["mail"], count=20)
    channels = [
        {
            "name": "mail",
            "type": "email",
            "host": "127.0.0.1",
            "port": port,
            "security": "none",
            "from": "changewatch@example.com",
            "to": ["team@example.com"],
        }
    ]
    for _ in range(KILLS):
        kill_while_held(warehouse_url, channels, hold, after=5)
    last = finish(warehouse_url, channels)

    received = Counter(hold.seen)
    assert max(received.values()) == 1  # at most once
    assert len(received) >= 20 - KILLS  # at most one lost per kill
    states = Counter(s for _, s, _ in statuses(warehouse_url))
    # Only the message in flight at each kill is parked; every other one was sent.
    assert states == {"sent": 20 - KILLS, "dead": KILLS}
    # The pass that parks one counts it as dead-lettered.
    assert "1 dead-lettered (1 cut short by a crash)" in last, last


def test_a_file_batch_cut_short_after_its_write_is_not_written_twice(
    warehouse_url: str, demo_api: DemoAPIServer, tmp_path: Path
) -> None:
    queue_notifications(warehouse_url, demo_api, ["log"], count=6)
    out = tmp_path / "notifications.jsonl"
    log = {"name": "log", "type": "file", "path": str(out)}
    # What a deliverer killed between its write and its record leaves: the batch's lines in
    # the file (four whole, then one torn), the batch claimed.
    with connect(warehouse_url) as wh:
        rows = wh.fetch_frame("SELECT * FROM outbox ORDER BY notification_id")
    notifications = [notification_of(r) for r in rows.iter_rows(named=True)]
    FileChannel("log", out).send_batch(notifications[:4])
    with out.open("ab") as file:
        file.write(notifications[4].to_json_bytes()[:40])
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    with connect(warehouse_url) as wh, wh.transaction():
        wh.execute(
            "UPDATE deliveries SET status = 'sending', attempts = 1, claimed_at = $1 "
            "WHERE notification_id IN (SELECT unnest(CAST($2 AS TEXT[])))",
            (long_ago, [n.notification_id for n in notifications[:5]]),
        )
    printed = finish(warehouse_url, [log])

    whole, torn = [], 0
    for line in out.read_bytes().splitlines():
        try:
            whole.append(json.loads(line)["notification_id"])
        except ValueError:
            torn += 1
    # Every notification once; the torn line stays torn, on a line of its own.
    assert sorted(whole) == sorted(n.notification_id for n in notifications)
    assert torn == 1
    assert "5 requeued after a crash" in printed
    assert sorted(statuses(warehouse_url)) == [("log", "sent", 1)] + [("log", "sent", 2)] * 5


@pytest.mark.e2e  # kill tests: a deliverer process SIGKILLed three times
def test_kill_9_during_file_delivery_writes_each_line_once(
    warehouse_url: str, demo_api: DemoAPIServer, tmp_path: Path
) -> None:
    queue_notifications(warehouse_url, demo_api, ["log"], count=20)
    out = tmp_path / "notifications.jsonl"
    channels = [{"name": "log", "type": "file", "path": str(out)}]
    # Batches of 2: killed as soon as its first lines are in the file, the deliverer is
    # recording that batch or working on the next; a later pass finds what it wrote.
    proc = run_driver(warehouse_url, channels, "2")
    give_up = time.monotonic() + STUCK
    try:
        while not (out.exists() and out.stat().st_size):
            assert proc.poll() is None, "the deliverer ended before writing"
            assert time.monotonic() < give_up, "the deliverer wrote nothing"
            time.sleep(0.001)
    finally:
        proc.kill()
        proc.communicate()
    time.sleep(LEASE + 0.05)
    finish(warehouse_url, channels)

    written = Counter(json.loads(line)["notification_id"] for line in out.read_text().splitlines())
    assert written == Counter(outbox_ids(warehouse_url))  # each once
    assert {s for _, s, _ in statuses(warehouse_url)} == {"sent"}
