"""The webhook channel against a real HTTP receiver that verifies Standard Webhooks signatures."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
import traceback

import pytest
import standardwebhooks
from changewatch.channels import DeliveryError, WebhookChannel
from changewatch.channels.config import WebhookChannelConfig

KEY = b"0123456789abcdef0123456789abcdef"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
TOLERANCE = 300


def verify(secret: str, headers: dict[str, str], body: bytes) -> None:
    """Standard Webhooks verification, written from the spec (independently of the channel)."""
    msg_id = headers["webhook-id"]
    timestamp = headers["webhook-timestamp"]
    assert abs(time.time() - int(timestamp)) < TOLERANCE, "timestamp out of tolerance"
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    signatures = [s.split(",", 1) for s in headers["webhook-signature"].split(" ")]
    assert any(
        version == "v1" and hmac.compare_digest(base64.b64decode(sig), expected)
        for version, sig in signatures
    ), "no valid v1 signature"


def channel(url: str, **overrides) -> WebhookChannel:
    values = {"name": "hook", "type": "webhook", "url": url, "timeout": 5}
    values.update(overrides)
    return WebhookChannel(WebhookChannelConfig.model_validate(values))


@pytest.fixture
def secret(monkeypatch) -> str:
    monkeypatch.setenv("CW_TEST_WEBHOOK_SECRET", SECRET)
    return SECRET


def secret_free(exc: BaseException) -> bool:
    text = "".join(traceback.format_exception(exc)) + repr(exc)
    return SECRET not in text and SECRET.removeprefix("whsec_") not in text


def test_signed_post_verifies(http_receiver, secret, notification_factory) -> None:
    n = notification_factory()
    channel(f"{http_receiver.url}/hooks/cw", secret_env="CW_TEST_WEBHOOK_SECRET").send(n)
    [req] = http_receiver.requests
    assert req.method == "POST" and req.path == "/hooks/cw"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["webhook-id"] == n.notification_id
    verify(secret, req.headers, req.body)
    # And the reference implementation agrees, returning the notification's JSON.
    assert standardwebhooks.Webhook(secret).verify(req.body, req.headers) == n.to_json()


def test_tampered_body_fails_verification(http_receiver, secret, notification_factory) -> None:
    channel(http_receiver.url, secret_env="CW_TEST_WEBHOOK_SECRET").send(notification_factory())
    [req] = http_receiver.requests
    with pytest.raises(AssertionError, match="no valid v1 signature"):
        verify(secret, req.headers, req.body.replace(b"closed", b"opened"))
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(req.body.replace(b"42", b"43"), req.headers)


def test_retry_after_503_has_the_same_webhook_id(
    http_receiver, secret, notification_factory
) -> None:
    http_receiver.responses = [(503, {"retry-after": "7"})]
    n = notification_factory()
    hook = channel(http_receiver.url, secret_env="CW_TEST_WEBHOOK_SECRET")
    with pytest.raises(DeliveryError, match="HTTP 503") as info:
        hook.send(n)
    assert info.value.retryable is True and info.value.retry_after == 7
    assert secret_free(info.value)
    hook.send(n)  # the retry, answered 200
    first, second = http_receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == n.notification_id
    assert first.body == second.body
    for req in (first, second):
        verify(secret, req.headers, req.body)


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (404, False), (429, True),
                                                   (500, True)])  # fmt: skip
def test_status_decides_retryable(
    http_receiver, secret, notification_factory, status, retryable
) -> None:
    http_receiver.responses = [(status, {})]
    with pytest.raises(DeliveryError, match=f"HTTP {status}") as info:
        channel(http_receiver.url, secret_env="CW_TEST_WEBHOOK_SECRET").send(notification_factory())
    assert info.value.retryable is retryable
    assert secret_free(info.value)


def test_connection_refused_is_retryable(closed_port, secret, notification_factory) -> None:
    url = f"http://127.0.0.1:{closed_port}/hook/path-token-123"
    with pytest.raises(DeliveryError) as info:
        channel(url, secret_env="CW_TEST_WEBHOOK_SECRET").send(notification_factory())
    assert info.value.retryable is True
    assert secret_free(info.value)
    assert "path-token-123" not in str(info.value)  # paths may hold tokens: host only


def test_timeout_is_retryable(secret, notification_factory) -> None:
    import socket

    # A listener that never accepts nor answers: the request times out.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        with pytest.raises(DeliveryError, match="timed out") as info:
            channel(url, secret_env="CW_TEST_WEBHOOK_SECRET", timeout=0.3).send(
                notification_factory()
            )
    assert info.value.retryable is True


def test_secret_and_headers_never_logged(
    http_receiver, secret, notification_factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    http_receiver.responses = [(500, {})]
    hook = channel(http_receiver.url, secret_env="CW_TEST_WEBHOOK_SECRET")
    with pytest.raises(DeliveryError):
        hook.send(notification_factory())
    hook.send(notification_factory())
    signatures = [r.headers["webhook-signature"] for r in http_receiver.requests]
    assert SECRET.removeprefix("whsec_") not in caplog.text
    assert all(sig.split(",", 1)[1] not in caplog.text for sig in signatures)


def test_missing_or_malformed_secret_is_permanent(
    http_receiver, monkeypatch, notification_factory
) -> None:
    hook = channel(http_receiver.url, secret_env="CW_TEST_WEBHOOK_SECRET")
    monkeypatch.delenv("CW_TEST_WEBHOOK_SECRET", raising=False)
    with pytest.raises(DeliveryError, match="CW_TEST_WEBHOOK_SECRET") as info:
        hook.send(notification_factory())
    assert info.value.retryable is False
    bad = "whsec_not*base64!zzsecretvalue"
    monkeypatch.setenv("CW_TEST_WEBHOOK_SECRET", bad)
    with pytest.raises(DeliveryError, match="not base64") as info:
        hook.send(notification_factory())
    assert info.value.retryable is False
    assert "zzsecretvalue" not in "".join(traceback.format_exception(info.value))
    assert http_receiver.requests == []


def test_unsigned_without_secret(http_receiver, notification_factory) -> None:
    n = notification_factory()
    channel(http_receiver.url).send(n)
    [req] = http_receiver.requests
    assert req.headers["webhook-id"] == n.notification_id
    assert "webhook-signature" not in req.headers
