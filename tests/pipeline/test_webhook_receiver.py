"""The webhook receiver on loopback, spoken to by a real HTTP client, its inbox a real file.

Signatures are made independently of our code: GitHub's documented test values and the
`standardwebhooks` library's signer. Whatever is refused leaves the inbox as it was.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from changewatch.channels.webhook_signatures import SignatureError, signing_key, verify
from changewatch.pipeline.webhooks.webhook_inbox import Inbox
from changewatch.pipeline.webhooks.webhook_receiver import WebhookReceiver, WebhookSetupError
from changewatch.sources import SourceBase
from pydantic import TypeAdapter
from standardwebhooks.webhooks import Webhook

GITHUB_SECRET = "It's a Secret to Everybody"
STANDARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
HMAC_SECRET = "plain-hmac-s3cret"
ENV = {"GH_HOOK": GITHUB_SECRET, "STD_HOOK": STANDARD_SECRET, "RAW_HOOK": HMAC_SECRET}
BODY = b'{"action": "edited", "issue": {"number": 7}}'


def config(name: str, webhook: dict) -> SourceBase:
    from changewatch.sources import SourceConfig

    return TypeAdapter(SourceConfig).validate_python(
        {
            "name": name,
            "type": "rest",
            "base_url": "http://127.0.0.1:9",
            "path": "/issues",
            "table": name,
            "primary_key": "number",
            "columns": {"number": "bigint"},
            "webhook": webhook,
        }
    )


SOURCES = [
    config("gh", {"path": "/hooks/gh", "secret_env": "GH_HOOK", "provider": "github"}),
    config("std", {"path": "/hooks/std", "secret_env": "STD_HOOK", "max_body_bytes": "1KiB"}),
    config("raw", {"path": "/hooks/raw", "secret_env": "RAW_HOOK", "provider": "hmac"}),
]


@pytest.fixture
def inbox(tmp_path: Path) -> Inbox:
    return Inbox(tmp_path / "inbox.sqlite")


@pytest.fixture
def receiver(inbox: Inbox) -> Iterator[WebhookReceiver]:
    with WebhookReceiver(SOURCES, inbox=inbox, port=0, environ=ENV) as server:
        yield server


def stored(inbox: Inbox) -> list[tuple[str, str, bytes]]:
    if not inbox.path.exists():
        return []
    with sqlite3.connect(inbox.path) as con:
        return con.execute("SELECT source, delivery_id, body FROM webhook_inbox").fetchall()


def github_headers(body: bytes, delivery: str, secret: str = GITHUB_SECRET) -> dict[str, str]:
    mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={mac}",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "issues",
        "Content-Type": "application/json",
    }


def standard_headers(body: bytes, msg_id: str, at: datetime | None = None) -> dict[str, str]:
    at = at or datetime.now(UTC)
    signature = Webhook(STANDARD_SECRET).sign(msg_id, at, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
        "Content-Type": "application/json",
    }


def test_githubs_documented_signature_verifies() -> None:
    # GitHub's docs ("Validating webhook deliveries"): this secret and payload give this value.
    header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    headers = {"x-hub-signature-256": header, "x-github-delivery": "d-1"}
    key = signing_key("github", GITHUB_SECRET)
    assert verify("github", key, headers, b"Hello, World!", now=0).delivery_id == "d-1"
    with pytest.raises(SignatureError):
        verify("github", key, headers, b"Hello, World?", now=0)


def test_a_github_signature_without_its_sha256_prefix_is_refused() -> None:
    # The right digest, bare: GitHub always sends the prefix, so this did not come from it.
    digest = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    key = signing_key("github", GITHUB_SECRET)
    for header in (digest, f"sha1={digest}", f"SHA256={digest}", f" {digest}"):
        headers = {"x-hub-signature-256": header, "x-github-delivery": "d-1"}
        with pytest.raises(SignatureError, match="does not start with sha256="):
            verify("github", key, headers, b"Hello, World!", now=0)
    # The generic scheme still takes both forms.
    for header in (digest, f"sha256={digest}"):
        headers = {"x-signature-256": header, "x-delivery-id": "d-2"}
        assert verify("hmac", key, headers, b"Hello, World!", now=0).delivery_id == "d-2"


def test_standard_webhooks_signatures_from_the_reference_library_verify() -> None:
    key = signing_key("standard", STANDARD_SECRET)
    headers = {k.lower(): v for k, v in standard_headers(BODY, "msg_1").items()}
    assert verify("standard", key, headers, BODY, now=time.time()).delivery_id == "msg_1"
    # During a secret rotation the sender signs with both: any one that matches will do.
    rotated = Webhook("whsec_" + "b3RoZXIta2V5").sign("msg_1", datetime.now(UTC), BODY.decode())
    headers["webhook-signature"] = f"{rotated} {headers['webhook-signature']}"
    assert verify("standard", key, headers, BODY, now=time.time()).delivery_id == "msg_1"
    headers["webhook-signature"] = rotated
    with pytest.raises(SignatureError, match="does not match"):
        verify("standard", key, headers, BODY, now=time.time())


def test_verified_deliveries_are_stored_once(receiver, inbox) -> None:
    url = receiver.url
    github = httpx.post(f"{url}/hooks/gh", content=BODY, headers=github_headers(BODY, "gh-1"))
    assert github.status_code == 202, github.text
    assert github.json() == {"status": "stored", "delivery": "gh-1"}
    standard = httpx.post(f"{url}/hooks/std", content=BODY, headers=standard_headers(BODY, "m-1"))
    assert standard.status_code == 202, standard.text
    mac = hmac.new(HMAC_SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    raw = httpx.post(f"{url}/hooks/raw", content=BODY, headers={"X-Signature-256": mac})
    assert raw.status_code == 202, raw.text
    assert sorted(stored(inbox)) == [
        ("gh", "gh-1", BODY),
        ("raw", "sha256:" + hashlib.sha256(BODY).hexdigest(), BODY),  # no id header: its hash
        ("std", "m-1", BODY),
    ]

    # The providers' retries: the same delivery ids, answered 200, stored nothing more. (A
    # Standard Webhooks retry is signed anew, with the time of the attempt.)
    again = httpx.post(f"{url}/hooks/gh", content=BODY, headers=github_headers(BODY, "gh-1"))
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    retry = httpx.post(f"{url}/hooks/std", content=BODY, headers=standard_headers(BODY, "m-1"))
    assert retry.status_code == 200
    assert len(stored(inbox)) == 3
    # The same id at another source's path is another delivery.
    other = httpx.post(f"{url}/hooks/std", content=BODY, headers=standard_headers(BODY, "gh-1"))
    assert other.status_code == 202
    assert len(stored(inbox)) == 4


def test_forged_replayed_stale_and_oversized_deliveries_store_nothing(receiver, inbox, caplog):
    caplog.set_level(logging.INFO)
    url = receiver.url
    stale = datetime.fromtimestamp(time.time() - 360, UTC)  # 6 minutes: past the 5 allowed
    ahead = datetime.fromtimestamp(time.time() + 360, UTC)
    tampered = github_headers(BODY, "gh-2")
    std = standard_headers(BODY, "m-2")
    cases = {
        "wrong secret": ("/hooks/gh", BODY, github_headers(BODY, "gh-2", secret="guess")),
        "tampered body": ("/hooks/gh", BODY + b" ", tampered),
        "no signature": ("/hooks/gh", BODY, {"X-GitHub-Delivery": "gh-3"}),
        "stale timestamp": ("/hooks/std", BODY, standard_headers(BODY, "m-3", stale)),
        "timestamp ahead": ("/hooks/std", BODY, standard_headers(BODY, "m-4", ahead)),
        "id swapped": ("/hooks/std", BODY, {**std, "webhook-id": "m-5"}),
        "timestamp swapped": (
            "/hooks/std",
            BODY,
            {**std, "webhook-timestamp": str(int(time.time()) + 1)},
        ),
        "no timestamp": ("/hooks/std", BODY, {**std, "webhook-timestamp": ""}),
        "raw forged": ("/hooks/raw", BODY, {"X-Signature-256": "sha256=" + "0" * 64}),
        "another source's scheme": ("/hooks/raw", BODY, github_headers(BODY, "gh-4")),
    }
    for case, (path, body, headers) in cases.items():
        answer = httpx.post(url + path, content=body, headers=headers)
        assert answer.status_code == 401, (case, answer.text)
    # A signed GitHub delivery without a delivery id cannot be deduplicated: refused.
    no_id = {k: v for k, v in github_headers(BODY, "x").items() if k != "X-GitHub-Delivery"}
    assert httpx.post(f"{url}/hooks/gh", content=BODY, headers=no_id).status_code == 400
    # Over the source's max_body_bytes (1 KiB): 413, before any signature is looked at.
    big = b'{"pad": "' + b"x" * 2048 + b'"}'
    too_big = httpx.post(f"{url}/hooks/std", content=big, headers=standard_headers(big, "m-6"))
    assert too_big.status_code == 413 and "max_body_bytes" in too_big.text
    # Chunked, so no length declared: 411.
    chunked = httpx.post(
        f"{url}/hooks/std", content=iter([BODY]), headers=standard_headers(BODY, "m-7")
    )
    assert chunked.status_code == 411
    assert httpx.post(f"{url}/hooks/none", content=BODY).status_code == 404
    assert httpx.get(f"{url}/hooks/gh").status_code == 405

    assert stored(inbox) == []
    logged = caplog.text
    assert "refused" in logged
    for secret in ENV.values():
        assert secret not in logged
    assert "sha256=" not in logged and "v1," not in logged  # no signature in the log


def test_a_github_ping_is_answered_and_not_stored(receiver, inbox) -> None:
    headers = github_headers(b"{}", "ping-1") | {"X-GitHub-Event": "ping"}
    answer = httpx.post(f"{receiver.url}/hooks/gh", content=b"{}", headers=headers)
    assert answer.status_code == 200 and answer.json() == {"status": "pong"}
    assert stored(inbox) == []


def test_a_missing_or_bad_secret_stops_the_receiver_in_one_line(inbox) -> None:
    with pytest.raises(WebhookSetupError) as missing:
        WebhookReceiver(SOURCES, inbox=inbox, port=0, environ={**ENV, "STD_HOOK": " "})
    assert str(missing.value) == (
        "source 'std': webhook.secret_env: environment variable STD_HOOK is not set"
    )
    with pytest.raises(WebhookSetupError, match="not base64") as bad:
        WebhookReceiver(SOURCES, inbox=inbox, port=0, environ={**ENV, "STD_HOOK": "whsec_!!"})
    assert "!!" not in str(bad.value)
    with pytest.raises(WebhookSetupError, match="declares `webhook:`"):
        WebhookReceiver([], inbox=inbox, port=0, environ=ENV)


def test_the_receiver_binds_to_loopback_by_default(inbox) -> None:
    with WebhookReceiver(SOURCES, inbox=inbox, port=0, environ=ENV) as server:
        assert server.url.startswith("http://127.0.0.1:")
