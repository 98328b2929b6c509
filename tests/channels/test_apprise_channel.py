"""The Apprise channel, at the wire: Apprise's json:// scheme against a loopback receiver."""

from __future__ import annotations

import json

import pytest
from changewatch.channels import AppriseChannel, DeliveryError
from changewatch.channels.config import AppriseChannelConfig


def channel() -> AppriseChannel:
    return AppriseChannel(
        AppriseChannelConfig(name="chat", type="apprise", url_env="CW_TEST_APPRISE_URL", timeout=5)
    )


def test_posts_title_and_message(http_receiver, monkeypatch, notification_factory) -> None:
    monkeypatch.setenv("CW_TEST_APPRISE_URL", f"json://127.0.0.1:{http_receiver.port}/notify")
    channel().send(notification_factory())
    [req] = http_receiver.requests
    assert req.method == "POST" and req.path == "/notify"
    doc = json.loads(req.body)
    assert doc["title"] == "[high] closed_bugs: Issue #42 closed: crash on start"
    assert "The crash on start was fixed and the issue closed." in doc["message"]
    assert "https://tracker.example/issues/42" in doc["message"]
    assert doc["type"] == "warning"


def test_normal_urgency_is_info(http_receiver, monkeypatch, notification_factory) -> None:
    monkeypatch.setenv("CW_TEST_APPRISE_URL", f"json://127.0.0.1:{http_receiver.port}/")
    channel().send(notification_factory(urgency="normal", summary=None))
    doc = json.loads(http_receiver.requests[0].body)
    assert doc["type"] == "info" and doc["title"].startswith("closed_bugs: ")
    assert "state: open -> closed" in doc["message"]


def test_server_error_is_retryable_and_url_not_shown(
    http_receiver, monkeypatch, notification_factory
) -> None:
    http_receiver.responses = [(500, {})]
    monkeypatch.setenv(
        "CW_TEST_APPRISE_URL", f"json://127.0.0.1:{http_receiver.port}/tok-en-secret"
    )
    with pytest.raises(DeliveryError) as info:
        channel().send(notification_factory())
    assert info.value.retryable is True
    assert "tok-en-secret" not in str(info.value)
    assert len(http_receiver.requests) == 1


def test_missing_or_unsupported_url_is_permanent(monkeypatch, notification_factory) -> None:
    monkeypatch.delenv("CW_TEST_APPRISE_URL", raising=False)
    with pytest.raises(DeliveryError, match="CW_TEST_APPRISE_URL") as info:
        channel().send(notification_factory())
    assert info.value.retryable is False
    monkeypatch.setenv("CW_TEST_APPRISE_URL", "nosuchscheme://tok-en-secret")
    with pytest.raises(DeliveryError, match="not a URL Apprise supports") as info:
        channel().send(notification_factory())
    assert info.value.retryable is False
    assert "tok-en-secret" not in str(info.value)
