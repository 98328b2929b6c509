"""From the outbox to real receivers, on DuckDB and Postgres: deliveries, retries, digests."""

from __future__ import annotations

import email
import email.policy
import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks
from changewatch.channels.config import (
    DigestConfig,
    EmailChannelConfig,
    FileChannelConfig,
    RetryConfig,
    WebhookChannelConfig,
)
from changewatch.channels.outbox import DeliveryPolicy, deliver_due, send_digest_window
from changewatch.evaluators.config import Watch
from changewatch.evaluators.evaluate import evaluate_watch
from changewatch.evaluators.filters import compile_filter
from changewatch.sources.demo import DemoAPIServer
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from cw_testing import demo_source_settings

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # base64 of 24 bytes, test only


def queue_notifications(
    url: str,
    api: DemoAPIServer,
    channels: list[str],
    count: int = 3,
    name: str = "first_issues",
    where: str | None = None,
) -> None:
    """Sync the demo API and let a watch queue notifications for the first `count` issues
    (or those `where` says)."""
    columns = {"number": "bigint", "title": "text", "html_url": "text", "updated_at": "timestamp"}
    source = RestSourceConfig.model_validate(demo_source_settings(api.url, columns))
    watch = Watch(
        name=name,
        sources=["demo_issues"],
        where=where or f"number <= {count}",
        channels=channels,
        title="Issue #{{ key }}: {{ new.title }}",
    )
    compiled = compile_filter(
        watch.where, watch=watch.name, columns={c: s.type for c, s in source.columns.items()}
    )
    with connect(url) as wh:
        run_sync(wh, RestSource(source))
        evaluate_watch(wh, watch, {"demo_issues": source}, {"demo_issues": compiled})


def queued_day(url: str) -> datetime:
    """Midnight (UTC) of the day the notifications were queued: not of "now", which a run
    crossing midnight would have moved on."""
    with connect(url) as wh:
        (queued,) = wh.fetch("SELECT min(created_at) FROM outbox")[0]
    return queued.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def after(day: datetime, hours: float = 8) -> Any:
    """A clock reading `hours` into the day after `day`: its window has ended."""
    return lambda: day + timedelta(days=1, hours=hours)


def webhook(receiver: Any) -> WebhookChannelConfig:
    return WebhookChannelConfig(
        name="hook",
        type="webhook",
        url=f"{receiver.url}/changewatch",
        secret_env="CW_TEST_WEBHOOK_SECRET",
    )


def mailer(server: Any) -> EmailChannelConfig:
    return EmailChannelConfig.model_validate(
        {
            "name": "mail",
            "type": "email",
            "host": "127.0.0.1",
            "port": server.port,
            "security": "none",
            "from": "changewatch@example.com",
            "to": ["team@example.com"],
        }
    )


def statuses(url: str) -> list[tuple[str, str, int]]:
    with connect(url) as wh:
        return wh.fetch("SELECT channel, status, attempts FROM deliveries ORDER BY channel, status")


@pytest.fixture(autouse=True)
def webhook_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CW_TEST_WEBHOOK_SECRET", SECRET)


def test_each_notification_reaches_each_channel_once(
    warehouse_url: str, demo_api: DemoAPIServer, http_receiver: Any, smtp_server: Any
) -> None:
    smtp = smtp_server()
    queue_notifications(warehouse_url, demo_api, ["hook", "mail"])
    with connect(warehouse_url) as wh:
        stats = deliver_due(wh, [webhook(http_receiver), mailer(smtp)])
    assert (stats.sent, stats.by_channel) == (6, {"hook": 3, "mail": 3})
    verifier = standardwebhooks.Webhook(SECRET)
    received = [verifier.verify(r.body, r.headers) for r in http_receiver.requests]
    assert sorted(p["title"].split(":")[0] for p in received) == [
        "Issue #1",
        "Issue #2",
        "Issue #3",
    ]
    subjects = sorted(email.message_from_bytes(m.content)["Subject"] for m in smtp.handler.messages)
    assert [s.split(":")[1].strip() for s in subjects] == ["Issue #1", "Issue #2", "Issue #3"]

    # Delivered is delivered: another pass, and another evaluation, send nothing more.
    queue_notifications(warehouse_url, demo_api, ["hook", "mail"])
    with connect(warehouse_url) as wh:
        again = deliver_due(wh, [webhook(http_receiver), mailer(smtp)])
    assert again.sent == 0
    assert len(http_receiver.requests) == 3 and len(smtp.handler.messages) == 3
    assert {s for _, s, _ in statuses(warehouse_url)} == {"sent"}


def test_failures_retry_on_the_schedule_keeping_the_webhook_id(
    warehouse_url: str, demo_api: DemoAPIServer, http_receiver: Any
) -> None:
    queue_notifications(warehouse_url, demo_api, ["hook"], count=1)
    http_receiver.responses = [(503, {}), (503, {})]
    start = datetime.now(UTC) + timedelta(minutes=1)
    clock = {"now": start}
    policy = DeliveryPolicy(retry=RetryConfig(jitter=0))  # 5 s, then 5 min

    def deliver() -> Any:
        with connect(warehouse_url) as wh:
            return deliver_due(
                wh, [webhook(http_receiver)], now=lambda: clock["now"], policy=policy
            )

    assert deliver().retrying == 1
    clock["now"] = start + timedelta(seconds=4)  # the first wait is 5 s: not due yet
    assert deliver().retrying == 0 and len(http_receiver.requests) == 1
    clock["now"] = start + timedelta(seconds=6)
    assert deliver().retrying == 1  # second failure; next wait 5 min
    clock["now"] = start + timedelta(seconds=6 + 290)
    assert deliver().retrying == 0 and len(http_receiver.requests) == 2
    clock["now"] = start + timedelta(seconds=6 + 301)
    assert deliver().sent == 1
    ids = {r.headers["webhook-id"] for r in http_receiver.requests}
    assert len(http_receiver.requests) == 3 and len(ids) == 1
    assert statuses(warehouse_url) == [("hook", "sent", 3)]


def test_gives_up_into_dead_letter(
    warehouse_url: str, demo_api: DemoAPIServer, http_receiver: Any
) -> None:
    queue_notifications(warehouse_url, demo_api, ["hook"], count=2)
    http_receiver.responses = [(400, {})] + [(500, {})] * 10
    # Three attempts, no wait between them; the circuit never pauses here.
    policy = DeliveryPolicy(retry=RetryConfig(delays=[0, 0], pause_after=99))
    for _ in range(4):
        with connect(warehouse_url) as wh:
            deliver_due(wh, [webhook(http_receiver)], policy=policy)
    # One answered 400 (not retryable): dead at once. The other failed 3 times: dead.
    assert sorted(statuses(warehouse_url)) == [("hook", "dead", 1), ("hook", "dead", 3)]
    assert len(http_receiver.requests) == 4
    with connect(warehouse_url) as wh:
        errors = [row[0] for row in wh.fetch("SELECT last_error FROM deliveries")]
    assert all("HTTP" in e or "40" in e or "50" in e for e in errors)


def test_interrupted_email_is_parked_and_counted_dead_interrupted_webhook_is_sent_again(
    warehouse_url: str, demo_api: DemoAPIServer, http_receiver: Any, smtp_server: Any
) -> None:
    smtp = smtp_server()
    queue_notifications(warehouse_url, demo_api, ["hook", "mail"], count=1)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    with connect(warehouse_url) as wh, wh.transaction():
        # What a process killed in the middle of the sends leaves behind.
        wh.execute(
            "UPDATE deliveries SET status = 'sending', attempts = 1, claimed_at = $1", (long_ago,)
        )
    with connect(warehouse_url) as wh:
        stats = deliver_due(wh, [webhook(http_receiver), mailer(smtp)])
    # The email may have arrived and a mailbox cannot drop a copy: parked, counted as dead.
    # The webhook goes again with the same webhook-id, by which its receiver drops a repeat.
    assert (stats.interrupted, stats.dead, stats.requeued, stats.sent) == (1, 1, 1, 1)
    assert stats.metadata()["dead_lettered"] == 1
    assert smtp.handler.messages == []
    assert len(http_receiver.requests) == 1
    assert statuses(warehouse_url) == [("hook", "sent", 2), ("mail", "dead", 1)]


THREE_ATTEMPTS = DeliveryPolicy(retry=RetryConfig(delays=[5, 5]))


def test_an_interrupted_webhook_is_parked_once_its_attempts_are_spent(
    warehouse_url: str, demo_api: DemoAPIServer, http_receiver: Any
) -> None:
    queue_notifications(warehouse_url, demo_api, ["hook"], count=1)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    with connect(warehouse_url) as wh, wh.transaction():
        # A notification that kills its deliverer every time must not be tried forever.
        wh.execute(
            "UPDATE deliveries SET status = 'sending', attempts = 3, claimed_at = $1", (long_ago,)
        )
    with connect(warehouse_url) as wh:
        stats = deliver_due(wh, [webhook(http_receiver)], policy=THREE_ATTEMPTS)
    assert (stats.interrupted, stats.dead, stats.requeued) == (1, 1, 0)
    assert http_receiver.requests == []
    assert statuses(warehouse_url) == [("hook", "dead", 3)]


def test_a_claim_younger_than_the_lease_is_left_alone(
    warehouse_url: str, demo_api: DemoAPIServer, http_receiver: Any
) -> None:
    queue_notifications(warehouse_url, demo_api, ["hook"], count=1)
    with connect(warehouse_url) as wh, wh.transaction():
        wh.execute(
            "UPDATE deliveries SET status = 'sending', attempts = 1, claimed_at = $1",
            (datetime.now(UTC) - timedelta(seconds=30),),
        )
    policy = DeliveryPolicy(lease=timedelta(minutes=1))
    with connect(warehouse_url) as wh:
        stats = deliver_due(wh, [webhook(http_receiver)], policy=policy)
    # Its sender may still be at it: nothing parked, nothing sent again.
    assert (stats.interrupted, stats.requeued, stats.sent) == (0, 0, 0)
    assert statuses(warehouse_url) == [("hook", "sending", 1)]


def test_unknown_channel_is_dead_lettered(warehouse_url: str, demo_api: DemoAPIServer) -> None:
    queue_notifications(warehouse_url, demo_api, ["gone"], count=1)
    with connect(warehouse_url) as wh:
        stats = deliver_due(wh, [])
    assert stats.dead == 1
    with connect(warehouse_url) as wh:
        assert "not configured" in wh.fetch("SELECT last_error FROM deliveries")[0][0]


def test_file_deliveries_go_in_batches_each_line_once(
    warehouse_url: str, demo_api: DemoAPIServer, tmp_path: Path
) -> None:
    queue_notifications(warehouse_url, demo_api, ["log"], count=5)
    out = tmp_path / "notifications.jsonl"
    log = FileChannelConfig(name="log", type="file", path=str(out))
    policy = DeliveryPolicy(batch_size=2)  # batches of 2, 2 and 1
    with connect(warehouse_url) as wh:
        stats = deliver_due(wh, [log], policy=policy)
        ids = [r[0] for r in wh.fetch("SELECT notification_id FROM outbox ORDER BY change_id")]
        again = deliver_due(wh, [log], policy=policy)
    assert (stats.sent, stats.by_channel, again.sent) == (5, {"log": 5}, 0)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # Every notification once, in the order of their changes.
    assert [line["notification_id"] for line in lines] == ids
    assert sorted(line["title"].split(":")[0] for line in lines) == [
        f"Issue #{n}" for n in range(1, 6)
    ]
    assert statuses(warehouse_url) == [("log", "sent", 1)] * 5


def test_a_batch_records_each_notifications_own_outcome(
    warehouse_url: str, demo_api: DemoAPIServer, http_receiver: Any
) -> None:
    queue_notifications(warehouse_url, demo_api, ["hook"], count=3)
    # One batch of three sends: delivered, refused for now, refused for good.
    http_receiver.responses = [(200, {}), (503, {}), (400, {})]
    policy = DeliveryPolicy(message_batch_size=3)
    with connect(warehouse_url) as wh:
        stats = deliver_due(wh, [webhook(http_receiver)], policy=policy)
        rows = wh.fetch("SELECT notification_id, status, attempts, last_error FROM deliveries")
    assert (stats.sent, stats.retrying, stats.dead) == (1, 1, 1)
    outcome = {nid: (status, attempts, error) for nid, status, attempts, error in rows}
    sent, retried, refused = (outcome[r.headers["webhook-id"]] for r in http_receiver.requests)
    assert sent == ("sent", 1, None)
    assert retried[:2] == ("pending", 1) and "503" in retried[2]
    assert refused[:2] == ("dead", 1) and "400" in refused[2]


def test_each_send_is_recorded_as_it_completes(
    warehouse_url: str, demo_api: DemoAPIServer, http_receiver: Any
) -> None:
    queue_notifications(warehouse_url, demo_api, ["hook"], count=3)
    seen: list[list[str]] = []
    with connect(warehouse_url) as wh:

        def watching_clock() -> datetime:
            # Each claim and each outcome reads the clock: what is on record by then.
            seen.append(sorted(s for (s,) in wh.fetch("SELECT status FROM deliveries")))
            return datetime.now(UTC)

        deliver_due(wh, [webhook(http_receiver)], now=watching_clock)
    # Before the 2nd and 3rd claims, the earlier sends were already recorded as sent (one
    # claimed batch recorded at its end would show them 'sending').
    claims = [s for s in seen if "sent" in s or "sending" in s]
    assert ["pending", "sent", "sent"] in seen and ["pending", "pending", "sent"] in seen
    assert all(state.count("sending") <= 1 for state in claims)


def test_an_unreadable_notification_stops_the_pass_before_its_batch_is_claimed(
    warehouse_url: str, demo_api: DemoAPIServer, tmp_path: Path
) -> None:
    queue_notifications(warehouse_url, demo_api, ["log"], count=3)
    with connect(warehouse_url) as wh, wh.transaction():
        wh.execute("UPDATE outbox SET urgency = 'apocalyptic' WHERE object_key = '2'")
    log = FileChannelConfig(name="log", type="file", path=str(tmp_path / "n.jsonl"))
    with connect(warehouse_url) as wh, pytest.raises(ValueError, match="urgency"):
        deliver_due(wh, [log])
    # Nothing claimed, so nothing is parked as interrupted: fixed, all three go out.
    assert statuses(warehouse_url) == [("log", "pending", 0)] * 3
    with connect(warehouse_url) as wh, wh.transaction():
        wh.execute("UPDATE outbox SET urgency = 'high' WHERE object_key = '2'")
    with connect(warehouse_url) as wh:
        assert deliver_due(wh, [log]).sent == 3


def test_digest_window_is_sent_once(
    warehouse_url: str, demo_api: DemoAPIServer, smtp_server: Any, tmp_path: Any
) -> None:
    smtp = smtp_server()
    queue_notifications(warehouse_url, demo_api, [], count=3)
    digest = DigestConfig(
        name="daily",
        channel="mail",
        watches=["first_issues"],
        to=["boss@example.com"],
        output_dir=str(tmp_path / "digests"),
    )
    day = queued_day(warehouse_url)
    window = {"window_start": day, "window_end": day + timedelta(days=1), "now": after(day)}
    with connect(warehouse_url) as wh:
        first = send_digest_window(wh, digest, mailer(smtp), **window)
        second = send_digest_window(wh, digest, mailer(smtp), **window)
    assert (first.status, first.items) == ("sent", 3)
    assert second.status == "already_sent"
    assert len(smtp.handler.messages) == 1
    received = smtp.handler.messages[0]
    assert received.rcpt_tos == ["boss@example.com"]
    message = email.message_from_bytes(received.content, policy=email.policy.default)
    assert "3 change" in message["Subject"]
    text = message.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]
    html = message.get_body(preferencelist=("html",)).get_content()  # type: ignore[union-attr]
    for n in (1, 2, 3):
        assert f"Issue #{n}:" in text and f"Issue #{n}:" in html
    assert "First issues" in text and "https://demo.changewatch.local/" in html
    assert {p.suffix for p in (tmp_path / "digests").iterdir()} == {".eml", ".html"}
    with connect(warehouse_url) as wh:
        recorded = wh.fetch("SELECT status, item_count FROM digests")
    assert recorded == [("sent", 3)]


def test_empty_window_sends_nothing_unless_asked(
    warehouse_url: str, demo_api: DemoAPIServer, smtp_server: Any
) -> None:
    smtp = smtp_server()
    queue_notifications(warehouse_url, demo_api, [], count=1)
    long_ago = datetime(2026, 1, 5, tzinfo=UTC)
    window = {"window_start": long_ago, "window_end": long_ago + timedelta(days=1)}
    quiet = DigestConfig(name="quiet", channel="mail", watches=["first_issues"])
    chatty = DigestConfig(name="chatty", channel="mail", watches=["first_issues"], send_empty=True)
    with connect(warehouse_url) as wh:
        assert send_digest_window(wh, quiet, mailer(smtp), **window).status == "empty"
        assert send_digest_window(wh, chatty, mailer(smtp), **window).status == "sent"
    assert len(smtp.handler.messages) == 1


def test_failed_digest_can_be_sent_later(
    warehouse_url: str, demo_api: DemoAPIServer, smtp_server: Any, closed_port: int
) -> None:
    queue_notifications(warehouse_url, demo_api, [], count=1)
    digest = DigestConfig(name="daily", channel="mail", watches=["first_issues"])
    day = queued_day(warehouse_url)
    window = {"window_start": day, "window_end": day + timedelta(days=1), "now": after(day)}
    down = mailer(smtp_server()).model_copy(update={"port": closed_port})
    with connect(warehouse_url) as wh:
        assert send_digest_window(wh, digest, down, **window).status == "failed"
    smtp = smtp_server()
    with connect(warehouse_url) as wh:
        assert send_digest_window(wh, digest, mailer(smtp), **window).status == "sent"
        assert send_digest_window(wh, digest, mailer(smtp), **window).status == "already_sent"
    assert len(smtp.handler.messages) == 1


def test_an_open_window_is_not_closed_and_a_partial_digest_leaves_it_open(
    warehouse_url: str, demo_api: DemoAPIServer, smtp_server: Any
) -> None:
    smtp = smtp_server()
    queue_notifications(warehouse_url, demo_api, [], count=3)
    watches = ["first_issues", "later_issues"]
    digest = DigestConfig(name="daily", channel="mail", watches=watches)
    day = queued_day(warehouse_url)
    window = {"window_start": day, "window_end": day + timedelta(days=1)}
    # A watch of issues opened after the first sync: none yet.
    queue_notifications(warehouse_url, demo_api, [], name="later_issues", where="number > 40")
    with connect(warehouse_url) as wh:
        # Today is not over: sending it whole would lose what comes later.
        with pytest.raises(ValueError, match="'daily'.* has not ended"):  # DigestWindowOpen
            send_digest_window(wh, digest, mailer(smtp), **window)
        so_far = send_digest_window(wh, digest, mailer(smtp), **window, partial=True)
        assert (so_far.status, so_far.items, so_far.partial) == ("sent", 3, True)
        assert wh.fetch("SELECT count(*) FROM digests") == [(0,)]  # the day is still open
    # Later that day, five issues are opened.
    demo_api.tracker.mutate(create=5)
    queue_notifications(warehouse_url, demo_api, [], name="later_issues", where="number > 40")
    with connect(warehouse_url) as wh:
        whole = send_digest_window(wh, digest, mailer(smtp), **window, now=after(day))
        assert (whole.status, whole.items, whole.partial) == ("sent", 8, False)
        assert wh.fetch("SELECT status, item_count FROM digests") == [("sent", 8)]
    partial_mail, whole_mail = (
        email.message_from_bytes(m.content, policy=email.policy.default)
        for m in smtp.handler.messages
    )
    assert partial_mail["Subject"].endswith(": 3 change(s) (so far)")
    assert whole_mail["Subject"].endswith(": 8 change(s)")
    assert partial_mail["Message-ID"] != whole_mail["Message-ID"]
    assert ".partial@" in partial_mail["Message-ID"]
    # Date is when each was sent, not the end of the window.
    assert email.utils.parsedate_to_datetime(whole_mail["Date"]) == after(day)()
    assert email.utils.parsedate_to_datetime(partial_mail["Date"]) < day + timedelta(days=1)


def test_a_rerun_reports_what_the_window_was_sent_with(
    warehouse_url: str, demo_api: DemoAPIServer, smtp_server: Any
) -> None:
    smtp = smtp_server()
    queue_notifications(warehouse_url, demo_api, [], count=2)
    watches = ["first_issues", "later_issues"]
    digest = DigestConfig(name="daily", channel="mail", watches=watches)
    day = queued_day(warehouse_url)
    window = {"window_start": day, "window_end": day + timedelta(days=1), "now": after(day)}
    queue_notifications(warehouse_url, demo_api, [], name="later_issues", where="number > 40")
    with connect(warehouse_url) as wh:
        assert send_digest_window(wh, digest, mailer(smtp), **window).items == 2
    # Notifications stamped inside the window that arrive after it went out (here: the
    # clock is set past the window) are not counted as sent.
    demo_api.tracker.mutate(create=4)
    queue_notifications(warehouse_url, demo_api, [], name="later_issues", where="number > 40")
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT count(*) FROM outbox") == [(6,)]
    with connect(warehouse_url) as wh:
        again = send_digest_window(wh, digest, mailer(smtp), **window)
    assert (again.status, again.items) == ("already_sent", 2)
    assert len(smtp.handler.messages) == 1


def test_a_receiver_slower_than_the_timeout_gets_the_retry_with_the_same_webhook_id(
    warehouse_url: str, demo_api: DemoAPIServer
) -> None:
    # At least once, as the README says: the client gives up on a slow answer and retries;
    # the receiver, which did get the first, drops the second by its webhook-id.
    ids: list[str] = []
    retried = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length") or 0))
            ids.append(self.headers["webhook-id"])
            if len(ids) == 1:
                retried.wait(60)  # answers only once the client has given up and retried
            else:
                retried.set()
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        queue_notifications(warehouse_url, demo_api, ["hook"], count=1)
        hook = WebhookChannelConfig(
            name="hook",
            type="webhook",
            url=f"http://127.0.0.1:{server.server_address[1]}/h",
            timeout=1.0,
        )
        later = datetime.now(UTC) + timedelta(minutes=5)
        with connect(warehouse_url) as wh:
            assert deliver_due(wh, [hook]).retrying == 1
            second = deliver_due(wh, [hook], now=lambda: later)
    finally:
        retried.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert second.sent == 1
    assert len(ids) == 2 and len(set(ids)) == 1
    assert statuses(warehouse_url) == [("hook", "sent", 2)]
