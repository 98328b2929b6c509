"""Digest rendering, the digest email through aiosmtpd, and the .eml/.html fallback."""

from __future__ import annotations

import email
import email.policy
from datetime import UTC, datetime, timedelta

import pytest
from changewatch.channels import (
    DigestItem,
    build_digest_message,
    render_digest,
    send_email,
    write_digest_files,
)
from changewatch.channels.config import DigestConfig, EmailChannelConfig

START = datetime(2024, 5, 1, 6, 0, tzinfo=UTC)  # 08:00 in Berlin (CEST)
END = START + timedelta(days=1)


def item(watch: str, title: str, hours: float, **overrides) -> DigestItem:
    values = {
        "watch": watch,
        "title": title,
        "summary": f"summary of {title}",
        "url": f"https://tracker.example/{title.replace(' ', '-')}",
        "urgency": "normal",
        "created_at": START + timedelta(hours=hours),
        "object_key": title.split()[-1],
        "source": "demo_issues",
    }
    values.update(overrides)
    return DigestItem(**values)


ITEMS = [
    item("new_issues", "opened issue 7", 3),
    item("closed_bugs", "closed bug 1", 1),
    item("new_issues", "opened issue 9", 20, urgency="urgent"),
    item("closed_bugs", "closed bug 2", 12),
    item("new_issues", "opened issue 8", 10, summary=None),
]


def positions(text: str, needles: list[str]) -> list[int]:
    found = [text.index(n) for n in needles]
    return found


def render(**overrides):
    values = {
        "name": "daily",
        "window_start": START,
        "window_end": END,
        "items": ITEMS,
        "subject_template": "changewatch digest: {count} change(s) for {window}",
        "timezone": "Europe/Berlin",
    }
    values.update(overrides)
    return render_digest(**values)


def test_grouped_by_watch_newest_first_in_both_parts() -> None:
    parts = render()
    assert parts.count == 5
    order = ["closed_bugs", "closed bug 2", "closed bug 1",
             "new_issues", "opened issue 9", "opened issue 8", "opened issue 7"]  # fmt: skip
    for body in (parts.text, parts.html):
        found = positions(body, order)
        assert found == sorted(found), body
        assert "summary of closed bug 2" in body
        assert "https://tracker.example/opened-issue-9" in body
        assert "summary of opened issue 8" not in body
    assert 'href="https://tracker.example/closed-bug-1"' in parts.html
    # Each summary sits under its own item.
    assert parts.text.index("summary of closed bug 2") < parts.text.index("closed bug 1")


def test_header_has_window_in_timezone_and_count() -> None:
    parts = render()
    window = "2024-05-01 08:00 to 2024-05-02 08:00 (Europe/Berlin)"
    assert parts.subject == f"changewatch digest: 5 change(s) for {window}"
    for body in (parts.text, parts.html):
        assert window in body
        assert "5 changes in 2 watches" in body
    # Item times too are local: closed bug 2 came at 18:00 UTC, 20:00 in Berlin.
    assert "2024-05-01 20:00 · demo_issues 2" in parts.text
    assert "[urgent] opened issue 9" in parts.text


def test_html_escapes_everything() -> None:
    evil = item(
        "new_issues",
        "<script>alert('x')</script> & more",
        2,
        summary='"><img src=x onerror=alert(1)>',
        url="javascript:alert(1)",
    )
    parts = render(items=[evil], name="daily<b>")
    assert "<script>" not in parts.html and "<img" not in parts.html and "<b>" not in parts.html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in parts.html
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in parts.html
    assert 'href="javascript' not in parts.html
    assert "<script>alert('x')</script> & more" in parts.text  # the text part stays literal


def test_empty_digest_and_bad_subject_field() -> None:
    parts = render(items=[])
    assert parts.count == 0 and "No changes in this window." in parts.text
    assert "No changes in this window." in parts.html
    with pytest.raises(ValueError, match="unknown field"):
        render(subject_template="{count} {window.__class__}")
    with pytest.raises(ValueError, match="timezone-aware"):
        render(window_start=datetime(2024, 5, 1))


def configs(port: int = 25) -> tuple[DigestConfig, EmailChannelConfig]:
    digest = DigestConfig(
        name="daily",
        channel="mail",
        watches=["closed_bugs", "new_issues"],
        timezone="Europe/Berlin",
        to=["team@example.org"],
    )
    channel = EmailChannelConfig.model_validate(
        {"name": "mail", "type": "email", "host": "127.0.0.1", "port": port, "security": "none",
         "from": "changewatch@example.org", "to": ["ops@example.org"], "timeout": 5}
    )  # fmt: skip
    return digest, channel


def test_digest_through_smtp(smtp_server) -> None:
    server = smtp_server()
    digest, channel = configs(server.port)
    message = build_digest_message(digest, channel, window_start=START, window_end=END, items=ITEMS)
    send_email(message, channel)
    [received] = server.handler.messages
    assert received.rcpt_tos == ["team@example.org"]  # the digest's own recipients
    msg = email.message_from_bytes(received.content, policy=email.policy.default)
    assert msg["Subject"] == (
        "changewatch digest: 5 change(s) for 2024-05-01 08:00 to 2024-05-02 08:00 (Europe/Berlin)"
    )
    assert msg["To"] == "team@example.org" and msg["From"] == "changewatch@example.org"
    assert msg["Message-ID"] == "<digest.daily.20240501T060000Z-20240502T060000Z@example.org>"
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    for body in (text, html):
        found = positions(body, ["closed_bugs", "closed bug 2", "closed bug 1", "new_issues",
                                 "opened issue 9", "opened issue 8", "opened issue 7"])  # fmt: skip
        assert found == sorted(found)
    # Sending the same digest again gives the same message.
    again = build_digest_message(digest, channel, window_start=START, window_end=END, items=ITEMS)
    assert again["Message-ID"] == msg["Message-ID"] and again["Date"] == msg["Date"]


def test_write_digest_files(tmp_path) -> None:
    digest, channel = configs()
    message = build_digest_message(digest, channel, window_start=START, window_end=END, items=ITEMS)
    eml_path, html_path = write_digest_files(message, tmp_path / "digests")
    assert eml_path.name == "digest.daily.20240501T060000Z-20240502T060000Z.eml"
    assert html_path.with_suffix(".eml") == eml_path
    parsed = email.message_from_bytes(eml_path.read_bytes(), policy=email.policy.default)
    assert parsed["Subject"] == message["Subject"]
    assert parsed["Message-ID"] == message["Message-ID"]
    assert "closed bug 2" in parsed.get_body(preferencelist=("plain",)).get_content()
    html = html_path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "opened issue 9" in html
    # Written again (a re-run): the same two files, replaced.
    assert write_digest_files(message, tmp_path / "digests") == (eml_path, html_path)
    assert sorted(p.name for p in (tmp_path / "digests").iterdir()) == sorted(
        [eml_path.name, html_path.name]
    )
