"""Notification, its JSON form and id, config validation, and build_channel."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from changewatch.channels import (
    AppriseChannel,
    Channel,
    ConsoleChannel,
    DeliveryError,
    EmailChannel,
    FileChannel,
    WebhookChannel,
    build_channel,
    notification_id_for,
)
from changewatch.channels.config import ChannelConfig, DigestConfig
from pydantic import TypeAdapter, ValidationError

CHANNELS = TypeAdapter(ChannelConfig)


def test_notification_id_is_stable_per_dedupe_key() -> None:
    a = notification_id_for("demo_issues:42:closed")
    assert a == notification_id_for("demo_issues:42:closed")
    assert a != notification_id_for("demo_issues:43:closed")
    assert a.startswith("ntf_") and len(a) == 36 and a[4:].isalnum()


def test_to_json_is_stable_and_jsonable(notification_factory) -> None:
    n = notification_factory(
        created_at=datetime(2024, 5, 2, 8, 30, tzinfo=timezone(timedelta(hours=2))),
        payload={
            "old": {"estimate": Decimal("1.50"), "due": date(2024, 5, 1)},
            "labels": {"b", "a"},
            "seen": datetime(2024, 5, 2, 6, 0, tzinfo=UTC),
        },
    )
    doc = n.to_json()
    assert doc["created_at"] == "2024-05-02T06:30:00Z"
    assert doc["payload"] == {
        "old": {"estimate": "1.50", "due": "2024-05-01"},
        "labels": ["a", "b"],
        "seen": "2024-05-02T06:00:00Z",
    }
    assert set(doc) == {
        "notification_id", "watch", "source", "object_key", "kind", "title", "body", "url",
        "urgency", "summary", "created_at", "payload",
    }  # fmt: skip
    assert json.loads(n.to_json_bytes()) == doc


def test_to_json_bytes_are_canonical(notification_factory) -> None:
    n = notification_factory(notification_id="ntf_1", payload={"z": 1, "a": [1, "é"]})
    assert (
        n.to_json_bytes()
        == (
            '{"body":"state: open -> closed","created_at":"2024-05-02T06:30:00Z","kind":"update",'
            '"notification_id":"ntf_1","object_key":"42","payload":{"a":[1,"é"],"z":1},'
            '"source":"demo_issues","summary":"The crash on start was fixed and the issue closed.",'
            '"title":"Issue #42 closed: crash on start","urgency":"high",'
            '"url":"https://tracker.example/issues/42","watch":"closed_bugs"}'
        ).encode()
    )


def test_notification_validates_urgency_and_timezone(notification_factory) -> None:
    with pytest.raises(ValueError, match="urgency"):
        notification_factory(urgency="critical")
    with pytest.raises(ValueError, match="timezone-aware"):
        notification_factory(created_at=datetime(2024, 5, 2, 8, 30))


def test_delivery_error_carries_retryable() -> None:
    exc = DeliveryError("nope", retryable=False)
    assert exc.retryable is False and str(exc) == "nope" and exc.retry_after is None


def test_build_channel_for_each_config_type(tmp_path) -> None:
    configs = [
        ({"name": "out", "type": "console"}, ConsoleChannel),
        ({"name": "log", "type": "file", "path": str(tmp_path / "n.jsonl")}, FileChannel),
        (
            {"name": "mail", "type": "email", "host": "127.0.0.1", "from": "cw@example.org",
             "to": ["ops@example.org"], "password_env": "SMTP_PASSWORD",
             "ca_file": "/etc/ssl/certs/ca.pem"},
            EmailChannel,
        ),
        (
            {"name": "hook", "type": "webhook", "url": "https://hooks.example/x",
             "secret_env": "HOOK_SECRET"},
            WebhookChannel,
        ),
        ({"name": "chat", "type": "apprise", "url_env": "CHAT_URL"}, AppriseChannel),
    ]  # fmt: skip
    for raw, cls in configs:
        channel = build_channel(CHANNELS.validate_python(raw))
        assert isinstance(channel, cls)
        assert isinstance(channel, Channel)
        assert channel.name == raw["name"]


def test_apprise_config_takes_a_variable_name_never_the_url() -> None:
    with pytest.raises(ValidationError, match="environment variable name"):
        CHANNELS.validate_python(
            {"name": "chat", "type": "apprise", "url_env": "slack://T000/B000/XXXX"}
        )
    config = CHANNELS.validate_python({"name": "chat", "type": "apprise", "url_env": "CHAT_URL"})
    assert config.env_vars() == ["CHAT_URL"]


def test_digest_config_checks_timezone_and_subject_fields() -> None:
    base = {"name": "daily", "channel": "mail", "watches": ["closed_bugs"]}
    assert DigestConfig.model_validate({**base, "timezone": "Europe/Berlin"}).timezone
    with pytest.raises(ValidationError, match="time zone"):
        DigestConfig.model_validate({**base, "timezone": "Mars/Olympus"})
    with pytest.raises(ValidationError, match="unknown field"):
        DigestConfig.model_validate({**base, "subject": "{count} for {window.__class__}"})
