"""Signed feedback links: from a real email or webhook, over real HTTP, to a feedback server
recording in a real warehouse, on DuckDB and PostgreSQL."""

from __future__ import annotations

import email
import email.policy
import html
import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks
from changewatch.channels.config import DigestConfig, FeedbackConfig
from changewatch.channels.feedback import feedback_signature, verify_signature
from changewatch.channels.outbox import deliver_due, send_digest_window
from changewatch.evaluators.feedback import export_examples
from changewatch.evaluators.feedback_server import FeedbackServer
from changewatch.sources.demo import DemoAPIServer
from changewatch.warehouse import connect
from test_outbox import SECRET as WEBHOOK_SECRET
from test_outbox import mailer, queue_notifications, queued_day, webhook

SECRET_ENV = "CW_TEST_FEEDBACK_SECRET"
SECRET = "fb-s3cret-never-shown-9f2c1e"
WATCH = "first_issues"


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setenv("CW_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)


def feedback_config(url: str) -> FeedbackConfig:
    return FeedbackConfig(url=url, secret_env=SECRET_ENV)


def examples(url: str) -> list[tuple[str, str]]:
    """(object key, expected outcome) of the watch's feedback, as `eval --export-feedback`
    exports it; opened and closed here, as the server needs the DuckDB file in between."""
    with connect(url) as wh:
        return [(e.key, e.expect) for e in export_examples(wh, WATCH)]


def follow(link: str) -> httpx.Response:
    """Open a link as a browser would, then press the page's button (POST its form)."""
    page = httpx.get(link, timeout=10)
    assert page.status_code == 200, page.text
    action = html.unescape(re.search(r'<form method="post" action="([^"]+)"', page.text)[1])
    fields = dict(
        (html.unescape(n), html.unescape(v))
        for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text)
    )
    return httpx.post(httpx.URL(link).join(action), data=fields | {"note": "spot on"}, timeout=10)


def test_email_links_record_feedback_once_confirmed(
    warehouse_url: str,
    demo_api: DemoAPIServer,
    smtp_server: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="changewatch")
    smtp = smtp_server()
    queue_notifications(warehouse_url, demo_api, ["mail"], count=1)
    with FeedbackServer(
        feedback_config("http://unused.example"), warehouse_url=warehouse_url, port=0
    ) as server:
        with connect(warehouse_url) as wh:
            stats = deliver_due(wh, [mailer(smtp)], feedback=feedback_config(server.url))
        assert stats.sent == 1
        [received] = smtp.handler.messages
        msg = email.message_from_bytes(received.content, policy=email.policy.default)
        notification_id = msg["X-Changewatch-Notification-Id"]
        text = msg.get_body(preferencelist=("plain",)).get_content()
        body = msg.get_body(preferencelist=("html",)).get_content()
        links = dict(re.findall(r"^  (useful|noise): (\S+)\r?$", text, re.MULTILINE))
        assert set(links) == {"useful", "noise"}
        for verdict, link in links.items():
            assert link.startswith(f"{server.url}/feedback/{notification_id}/{verdict}?sig=")
            assert f'href="{html.escape(link)}"' in body

        # A mail scanner fetching every link records nothing.
        assert httpx.get(links["useful"], timeout=10).status_code == 200
        assert httpx.get(links["noise"], timeout=10).status_code == 200
        assert examples(warehouse_url) == []

        # A tampered, missing or borrowed signature is refused and records nothing.
        sig = links["useful"].rsplit("=", 1)[1]
        tampered = sig[:-1] + ("A" if sig[-1] != "A" else "B")
        useful_url = links["useful"].split("?")[0]
        for data in ({"sig": tampered}, {}, {"sig": links["noise"].rsplit("=", 1)[1]}):
            assert httpx.post(useful_url, data=data, timeout=10).status_code == 403
        assert httpx.get(f"{useful_url}?sig={tampered}", timeout=10).status_code == 403
        assert examples(warehouse_url) == []

        # Confirmed: recorded, exported as an example; the latest word wins.
        answer = follow(links["useful"])
        assert answer.status_code == 200 and "recorded as useful" in answer.text
        assert examples(warehouse_url) == [("1", "notify")]
        assert follow(links["noise"]).status_code == 200
        assert follow(links["noise"]).status_code == 200  # idempotent
        assert examples(warehouse_url) == [("1", "skip")]

        # A well-signed link to a notification the warehouse does not have.
        unknown = f"{server.url}/feedback/ntf_gone/useful"
        key = SECRET.encode()
        gone = httpx.post(unknown, data={"sig": feedback_signature(key, "ntf_gone", "useful")})
        assert gone.status_code == 404

    # The secret itself is nowhere: not in the mail, the tables, or the logs.
    with connect(warehouse_url) as wh:
        stored = wh.fetch("SELECT * FROM outbox") + wh.fetch("SELECT * FROM deliveries")
        stored += wh.fetch("SELECT * FROM feedback")
    assert stored and SECRET not in repr(stored)
    assert SECRET not in received.content.decode("utf-8", "replace")
    assert caplog.text and SECRET not in caplog.text and sig not in caplog.text


def test_webhook_body_carries_valid_links(
    tmp_path: Path, demo_api: DemoAPIServer, http_receiver: Any
) -> None:
    url = f"duckdb:///{tmp_path / 'warehouse.duckdb'}"
    queue_notifications(url, demo_api, ["hook"], count=2)
    with connect(url) as wh:
        sent = deliver_due(
            wh, [webhook(http_receiver)], feedback=feedback_config("https://fb.example/")
        )
    assert sent.sent == 2
    verifier = standardwebhooks.Webhook(WEBHOOK_SECRET)
    for request in http_receiver.requests:
        payload = verifier.verify(request.body, request.headers)  # signed with the links in it
        nid = payload["notification_id"]
        assert sorted(payload["feedback"]) == ["noise", "useful"]
        for verdict, link in payload["feedback"].items():
            path, sig = link.split("?sig=")
            assert path == f"https://fb.example/feedback/{nid}/{verdict}"
            assert verify_signature(SECRET.encode(), nid, verdict, sig)
        assert SECRET not in request.body.decode()
    # The outbox keeps the notification, not its links.
    with connect(url) as wh:
        assert not any("sig=" in row[0] for row in wh.fetch("SELECT payload FROM outbox"))

    # The digest of the same notifications links the same way.
    digest = DigestConfig(name="daily", watches=[WATCH], output_dir=str(tmp_path / "digests"))
    start = queued_day(url)
    with connect(url) as wh:
        result = send_digest_window(
            wh,
            digest,
            None,
            window_start=start,
            window_end=start + timedelta(days=1),
            partial=True,
            feedback=feedback_config("https://fb.example/"),
        )
    assert (result.status, result.items) == ("written", 2)
    page = Path(next(f for f in result.files if f.endswith(".html"))).read_text()
    for request in http_receiver.requests:
        for link in json.loads(request.body)["feedback"].values():
            assert f'href="{html.escape(link)}"' in page


def test_unset_secret_fails_delivery_naming_the_variable(
    tmp_path: Path,
    demo_api: DemoAPIServer,
    http_receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"duckdb:///{tmp_path / 'warehouse.duckdb'}"
    queue_notifications(url, demo_api, ["hook"], count=1)
    monkeypatch.delenv(SECRET_ENV)
    with connect(url) as wh:
        stats = deliver_due(wh, [webhook(http_receiver)], feedback=feedback_config("https://x.io"))
        [(status, error)] = wh.fetch("SELECT status, last_error FROM deliveries")
    assert (stats.sent, stats.dead, http_receiver.requests) == (0, 1, [])
    assert status == "dead"
    assert f"environment variable {SECRET_ENV} (the signing secret) is not set" in error
    # A digest fails the same way, before its window is claimed.
    digest = DigestConfig(name="daily", watches=[WATCH], output_dir=str(tmp_path / "digests"))
    start = queued_day(url)
    with connect(url) as wh:
        result = send_digest_window(
            wh,
            digest,
            None,
            window_start=start,
            window_end=start + timedelta(days=1),
            now=lambda: start + timedelta(days=1, hours=1),
            feedback=feedback_config("https://x.io"),
        )
        assert wh.fetch("SELECT count(*) FROM digests") == [(0,)]
    assert result.status == "failed" and SECRET_ENV in str(result.error)
    assert not (tmp_path / "digests").exists()
