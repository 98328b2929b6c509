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
        "body": f"body of {title}",
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
    item("new_issues", "opened issue 8", 10, body=""),
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
        "subject_template": "changewatch {name} digest for {day}: {count} change(s)",
        "timezone": "Europe/Berlin",
    }
    values.update(overrides)
    return render_digest(**values)


def test_grouped_by_watch_newest_first_in_both_parts() -> None:
    parts = render()
    assert parts.count == 5
    order = ["Closed bugs", "closed bug 2", "closed bug 1",
             "New issues", "opened issue 9", "opened issue 8", "opened issue 7"]  # fmt: skip
    for body in (parts.text, parts.html):
        found = positions(body, order)
        assert found == sorted(found), body
        assert "body of closed bug 2" in body
        assert "https://tracker.example/opened-issue-9" in body
        assert "body of opened issue 8" not in body
    assert 'href="https://tracker.example/closed-bug-1"' in parts.html
    # Each body sits under its own item.
    assert parts.text.index("body of closed bug 2") < parts.text.index("closed bug 1")


def test_header_has_window_in_timezone_and_count() -> None:
    parts = render()
    window = "2024-05-01 08:00 to 2024-05-02 08:00 (Europe/Berlin)"
    assert parts.subject == "changewatch daily digest for 2024-05-01: 5 change(s)"
    for body in (parts.text, parts.html):
        assert window in body
        assert "5 changes in 2 watches" in body
    # Item times too are local: closed bug 2 came at 18:00 UTC, 20:00 in Berlin.
    assert "2024-05-01 20:00 · demo_issues\n" in parts.text
    assert "[urgent] opened issue 9" in parts.text


def test_html_escapes_everything() -> None:
    evil = item(
        "new_issues",
        "<script>alert('x')</script> & more",
        2,
        body='"><img src=x onerror=alert(1)>',
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
    # The default subject names the digest and its day, in one header line.
    assert msg["Subject"] == "changewatch daily digest for 2024-05-01: 5 change(s)"
    assert msg["To"] == "team@example.org" and msg["From"] == "changewatch@example.org"
    assert msg["Message-ID"] == "<digest.daily.20240501T060000Z-20240502T060000Z@example.org>"
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    for body in (text, html):
        found = positions(body, ["Closed bugs", "closed bug 2", "closed bug 1", "New issues",
                                 "opened issue 9", "opened issue 8", "opened issue 7"])  # fmt: skip
        assert found == sorted(found)
    # Sending the same digest again gives the same message.
    again = build_digest_message(digest, channel, window_start=START, window_end=END, items=ITEMS)
    assert again["Message-ID"] == msg["Message-ID"] and again["Subject"] == msg["Subject"]


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


def test_items_show_the_watch_body_under_a_heading_with_the_key_once() -> None:
    items = [
        item("new_bugs", "New bug #16: crash on start", 2, object_key="16", url=None,
             body="crash on start, opened by ada (3 comments)."),
        item("closed_issues", "Closed: dark mode", 1, object_key="7", body="Closed after 2."),
        item("closed_issues", "Closed #5: typo", 3, object_key="5", body="Closed #5: typo",
             url=None),
    ]  # fmt: skip
    parts = render(items=items, headings={"new_bugs": "Bugs opened today"})
    for body in (parts.text, parts.html):
        # The watch's own body, not an automatic "insert of demo_issues 16".
        assert "crash on start, opened by ada (3 comments)." in body
        assert "insert of" not in body
        # A declared heading, else the watch's name made readable; never the bare name.
        assert "Bugs opened today" in body and "Closed issues" in body
        assert "new_bugs" not in body and "closed_issues" not in body
    # The title says #16 and #5: the key is not repeated; the title without a key gets it.
    assert parts.text.count("16") == 1 and parts.text.count("#5") == 1
    assert "2024-05-01 10:00 · demo_issues\n" in parts.text  # #16
    assert "2024-05-01 09:00 · demo_issues 7\n" in parts.text
    # A body that only repeats the title is not shown twice.
    assert parts.text.count("Closed #5: typo") == 1


def test_equal_times_sort_by_key_with_numbers_by_value() -> None:
    keys = ["16", "5", "1", "15", "b-2", "a-10", "a-9"]
    items = [item("new_bugs", f"issue {k}", 1, object_key=k) for k in keys]
    items.append(item("new_bugs", "issue 3", 2, object_key="3"))  # newer: first
    parts = render(items=items, subject_template="{count} change(s)")
    expected = ["3", "1", "5", "15", "16", "a-9", "a-10", "b-2"]
    for body in (parts.text, parts.html):
        found = positions(body, [f"issue {k}<" if body is parts.html else f"issue {k}\n"
                                 for k in expected])  # fmt: skip
        assert found == sorted(found), body


def test_date_is_the_send_time_and_the_subject_fits_one_header_line() -> None:
    digest, channel = configs()
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    end = start + timedelta(days=1)
    sent_at = start + timedelta(hours=3, minutes=4)
    message = build_digest_message(
        digest, channel, window_start=start, window_end=end, items=ITEMS, sent_at=sent_at
    )
    assert email.utils.parsedate_to_datetime(message["Date"]) == sent_at
    before = datetime.now(UTC).replace(microsecond=0)
    unsent = build_digest_message(digest, channel, window_start=START, window_end=END, items=ITEMS)
    assert before <= email.utils.parsedate_to_datetime(unsent["Date"]) <= datetime.now(UTC)
    # A long digest name or template is cut to one header line (RFC 5322: 78 characters).
    long = digest.model_copy(update={"name": "engineering_weekly_all_repositories_and_feeds"})
    subject = build_digest_message(long, channel, window_start=START, window_end=END,
                                   items=ITEMS)["Subject"]  # fmt: skip
    assert subject.startswith("changewatch engineering_weekly_all_repositories_and_feeds digest")
    assert len(subject) <= 77 and subject.endswith("…")
    wordy = render(subject_template="changewatch digest: {count} change(s) for {window}")
    assert len(wordy.subject) <= 77


def test_partial_digest_says_so_and_has_its_own_message_id() -> None:
    digest, channel = configs()
    cut = START + timedelta(hours=14)
    whole = build_digest_message(digest, channel, window_start=START, window_end=END, items=ITEMS)
    partial = build_digest_message(
        digest, channel, window_start=START, window_end=cut, items=ITEMS, partial=True
    )
    assert partial["Subject"] == "changewatch daily digest for 2024-05-01: 5 change(s) (so far)"
    assert partial["Message-ID"] == (
        "<digest.daily.20240501T060000Z-20240501T200000Z.partial@example.org>"
    )
    assert partial["Message-ID"] != whole["Message-ID"]
    text = partial.get_body(preferencelist=("plain",)).get_content()
    assert "2024-05-01 08:00 to 2024-05-01 22:00 (Europe/Berlin), so far" in text
