"""The email channel against a real SMTP server (aiosmtpd) on loopback."""

from __future__ import annotations

import email
import email.policy
import traceback

import pytest
from changewatch.channels import DeliveryError, EmailChannel, build_notification_message
from changewatch.channels.config import EmailChannelConfig

PASSWORD = "s3cret-Pa55word"


def config(port: int, **overrides) -> EmailChannelConfig:
    values = {
        "name": "mail",
        "type": "email",
        "host": "127.0.0.1",
        "port": port,
        "security": "none",
        "from": "changewatch@example.org",
        "to": ["ops@example.org", "dev@example.org"],
        "timeout": 5,
    }
    values.update(overrides)
    return EmailChannelConfig.model_validate(values)


def parse(content: bytes) -> email.message.EmailMessage:
    return email.message_from_bytes(content, policy=email.policy.default)


def check_message(received, notification) -> None:
    msg = parse(received.content)
    assert msg["Subject"] == "[high] closed_bugs: Issue #42 closed: crash on start"
    assert msg["From"] == "changewatch@example.org"
    assert msg["To"] == "ops@example.org, dev@example.org"
    assert msg["Message-ID"] == f"<{notification.notification_id}@example.org>"
    assert msg["Auto-Submitted"] == "auto-generated"
    assert msg.get_content_type() == "multipart/alternative"
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    for part in (text, html):
        assert "The crash on start was fixed and the issue closed." in part
        assert "https://tracker.example/issues/42" in part
    assert 'href="https://tracker.example/issues/42"' in html
    assert received.mail_from == "changewatch@example.org"
    assert sorted(received.rcpt_tos) == ["dev@example.org", "ops@example.org"]


def test_plain_smtp(smtp_server, notification_factory) -> None:
    server = smtp_server()
    n = notification_factory()
    EmailChannel(config(server.port)).send(n)
    [received] = server.handler.messages
    assert not received.tls and received.login is None
    check_message(received, n)


@pytest.mark.parametrize("mechanism", ["LOGIN", "PLAIN"])
def test_starttls_and_auth(
    smtp_server, tls_files, notification_factory, monkeypatch, mechanism
) -> None:
    other = "PLAIN" if mechanism == "LOGIN" else "LOGIN"
    server = smtp_server(
        login=("cw", PASSWORD),
        tls_context=tls_files.server_context(),
        require_starttls=True,
        auth_exclude_mechanism=[other],
    )
    monkeypatch.setenv("CW_TEST_SMTP_PASSWORD", PASSWORD)
    cfg = config(
        server.port,
        security="starttls",
        username="cw",
        password_env="CW_TEST_SMTP_PASSWORD",
        ca_file=str(tls_files.cert),
    )
    n = notification_factory()
    channel = EmailChannel(cfg)
    channel.send(n)
    channel.send(n)  # a retry: the very same message
    first, second = server.handler.messages
    assert first.tls and first.login == "cw"
    assert server.auth.mechanisms == [mechanism, mechanism]
    check_message(first, n)
    assert parse(first.content)["Message-ID"] == parse(second.content)["Message-ID"]


def test_implicit_tls(smtp_server, tls_files, notification_factory) -> None:
    server = smtp_server(ssl_context=tls_files.server_context())
    n = notification_factory()
    EmailChannel(config(server.port, security="ssl", ca_file=str(tls_files.cert))).send(n)
    [received] = server.handler.messages
    check_message(received, n)


def test_untrusted_certificate_is_permanent(smtp_server, tls_files, notification_factory) -> None:
    server = smtp_server(tls_context=tls_files.server_context())
    with pytest.raises(DeliveryError, match="certificate verification failed") as info:
        EmailChannel(config(server.port, security="starttls")).send(notification_factory())
    assert info.value.retryable is False
    assert server.handler.messages == []


def test_wrong_password_is_permanent_and_never_shown(
    smtp_server, tls_files, notification_factory, monkeypatch
) -> None:
    server = smtp_server(
        login=("cw", PASSWORD), tls_context=tls_files.server_context(), require_starttls=True
    )
    monkeypatch.setenv("CW_TEST_SMTP_PASSWORD", "wrong-" + PASSWORD)
    cfg = config(
        server.port,
        security="starttls",
        username="cw",
        password_env="CW_TEST_SMTP_PASSWORD",
        ca_file=str(tls_files.cert),
    )
    with pytest.raises(DeliveryError, match="login refused: 535") as info:
        EmailChannel(cfg).send(notification_factory())
    assert info.value.retryable is False
    assert PASSWORD not in "".join(traceback.format_exception(info.value))


def test_missing_password_variable_is_permanent(notification_factory, monkeypatch) -> None:
    monkeypatch.delenv("CW_TEST_SMTP_PASSWORD", raising=False)
    cfg = config(1, security="starttls", username="cw", password_env="CW_TEST_SMTP_PASSWORD")
    with pytest.raises(DeliveryError, match="CW_TEST_SMTP_PASSWORD") as info:
        EmailChannel(cfg).send(notification_factory())
    assert info.value.retryable is False


def test_credentials_are_never_sent_in_clear(notification_factory, monkeypatch) -> None:
    monkeypatch.setenv("CW_TEST_SMTP_PASSWORD", PASSWORD)
    cfg = config(1, security="none", username="cw", password_env="CW_TEST_SMTP_PASSWORD")
    with pytest.raises(DeliveryError, match="without TLS") as info:
        EmailChannel(cfg).send(notification_factory())
    assert info.value.retryable is False


def test_5xx_rejection_is_permanent(smtp_server, notification_factory) -> None:
    server = smtp_server()
    server.handler.rcpt_reply = "550 5.1.1 No such user"
    with pytest.raises(DeliveryError, match="550 5.1.1 No such user") as info:
        EmailChannel(config(server.port)).send(notification_factory())
    assert info.value.retryable is False


def test_4xx_reply_is_retryable(smtp_server, notification_factory) -> None:
    server = smtp_server()
    server.handler.data_reply = "451 4.3.0 Try again later"
    with pytest.raises(DeliveryError, match="451") as info:
        EmailChannel(config(server.port)).send(notification_factory())
    assert info.value.retryable is True


def test_server_down_is_retryable(closed_port, notification_factory) -> None:
    with pytest.raises(DeliveryError) as info:
        EmailChannel(config(closed_port)).send(notification_factory())
    assert info.value.retryable is True


def test_message_escapes_html_and_keeps_headers_on_one_line(notification_factory) -> None:
    n = notification_factory(
        title="<script>alert(1)</script>\r\nBcc: victim@example.org",
        url="javascript:alert(1)",
        urgency="normal",
    )
    msg = build_notification_message(n, config(25))
    assert msg["Bcc"] is None
    assert "\n" not in msg["Subject"]
    html = msg.get_body(preferencelist=("html",)).get_content()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert 'href="javascript' not in html
