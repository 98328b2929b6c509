"""FeedSource against a real loopback server: every feed format, typed columns, syncs, 304s."""

from __future__ import annotations

import functools
import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from apiserver import ApiServer, Received, Reply
from changewatch.sources.base import Validator
from changewatch.sources.errors import FetchError, PayloadError
from changewatch.sources.feed import (
    DEFAULT_COLUMNS,
    FeedSource,
    FeedSourceConfig,
    build_feed_source,
)
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.normalize import HASH_COLUMN, normalize
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from pydantic import ValidationError

FEEDS = Path(__file__).parent / "feeds"
SECRET = "feed-tok-5e4d3c2b1a"
RSS = "application/rss+xml; charset=utf-8"
ATOM = "application/atom+xml; charset=utf-8"


@pytest.fixture
def api():
    with ApiServer() as server:
        yield server


def serve(api: ApiServer, body: bytes | str, content_type: str, path: str = "/feed") -> None:
    """Answer every GET of ``path`` with ``body`` (a fixture file name, or the bytes)."""
    data = (FEEDS / body).read_bytes() if isinstance(body, str) else body
    api.route(path, lambda _request: Reply(200, data, {"Content-Type": content_type}))


def make_source(api: ApiServer, path: str = "/feed", **settings: Any) -> FeedSource:
    """A feed source named ``acme_feed`` reading ``path``; no retries, no real sleeping."""
    config = {
        "name": "acme_feed",
        "type": "feed",
        "table": "feed_entries",
        "url": api.url(path),
        **settings,
    }
    factory = functools.partial(HttpClient, sleep=[].append)
    return build_feed_source(config, policy=HttpPolicy(max_retries=0), client_factory=factory)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


# --- config -----------------------------------------------------------------------------------


def test_defaults_let_a_source_be_just_name_type_url_table():
    config = FeedSourceConfig.model_validate(
        {"name": "blog", "type": "feed", "url": "https://example.org/feed", "table": "posts"}
    )
    assert config.primary_key == ["entry_id"]
    assert config.updated_at == "updated_at"
    assert config.sync == "snapshot"
    assert {name: spec.type for name, spec in config.columns.items()} == DEFAULT_COLUMNS
    assert config.headers == {} and config.auth is None and config.env_vars() == []


def test_explicit_columns_replace_the_defaults():
    config = FeedSourceConfig.model_validate(
        {
            "name": "blog",
            "type": "feed",
            "url": "https://example.org/feed?format=rss",
            "table": "posts",
            "columns": {"entry_id": "text", "title": "text"},
        }
    )
    assert list(config.columns) == ["entry_id", "title"]
    assert config.updated_at is None  # no updated_at column, so no cursor column
    incremental = FeedSourceConfig.model_validate(
        {
            "name": "blog",
            "type": "feed",
            "url": "https://e.org/f",
            "table": "p",
            "sync": "incremental",
        }
    )
    assert incremental.updated_at == "updated_at"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"url": "ftp://example.org/feed"}, "http(s) URL"),
        ({"url": "https://user:pw@example.org/feed"}, "credentials"),
        ({"headers": {"Authorization": "Bearer x"}}, "look like credentials"),
        ({"columns": {"title": "text"}}, "primary_key column 'entry_id'"),
        ({"columns": {"entry_id": "text"}, "sync": "incremental"}, "needs updated_at"),
    ],
)
def test_bad_settings_are_rejected(settings, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FeedSourceConfig.model_validate(
            {"name": "blog", "type": "feed", "url": "https://example.org/feed", "table": "p"}
            | settings
        )


def test_auth_reads_only_environment_variable_names():
    config = FeedSourceConfig.model_validate(
        {
            "name": "private",
            "type": "feed",
            "url": "https://example.org/feed",
            "table": "p",
            "auth": {"type": "query", "name": "token", "value_env": "FEED_TOKEN"},
        }
    )
    assert config.env_vars() == ["FEED_TOKEN"]


# --- every format -----------------------------------------------------------------------------

# (entry_id, title, link, author, published_at, updated_at, tags) per entry, in feed order.
EXPECTED: dict[str, tuple[str, str, str, list[tuple]]] = {
    "rss20": (
        "github_blog.rss",
        RSS,
        "rss20",
        [
            (
                "https://blog.example.com/?p=82915",  # isPermaLink="false": an id, not a link
                "Securing the software supply chain \u2013 part 2",
                "https://blog.example.com/security/supply-chain-security/"
                "securing-the-software-supply-chain-part-2/",
                "Jane Doe",
                "2025-03-04T17:00:34Z",
                "2025-03-04T17:00:34Z",
                ["Security", "Supply chain security"],
            ),
            (
                "https://blog.example.com/podcast/episode-12/",
                "Episode 12: Shipping on Fridays",
                "https://blog.example.com/podcast/episode-12/",
                "John Smith",
                "2025-02-28T17:30:00Z",  # -0800 in the feed
                "2025-02-28T17:30:00Z",
                ["Podcast"],
            ),
            (
                "https://blog.example.com/changelog/2025-02/",
                "Changelog: February",
                "https://blog.example.com/changelog/2025-02/",
                "Release Bot",  # from <author>changelog@example.com (Release Bot)</author>
                "2025-02-01T00:00:00Z",
                "2025-02-01T00:00:00Z",
                [],
            ),
        ],
    ),
    "rss10": (
        "slashdot.rdf",
        "application/rdf+xml",
        "rss10",
        [
            (
                "https://news.example.net/story/25/03/04/1740229/open-source-maintainers-get-a-"
                "raise?utm_source=rss1.0mainlinkanon&utm_medium=feed",  # rdf:about
                "Open Source Maintainers Get a Raise",
                "https://news.example.net/story/25/03/04/1740229/open-source-maintainers-get-a-"
                "raise?utm_source=rss1.0mainlinkanon&utm_medium=feed",
                "msmash",
                None,  # dc:date is a modification date
                "2025-03-04T17:40:00Z",
                ["opensource"],
            ),
            (
                "https://news.example.net/story/25/03/04/0112345/a-new-kernel-is-out"
                "?utm_source=rss1.0mainlinkanon&utm_medium=feed",
                "A New Kernel Is Out",
                "https://news.example.net/story/25/03/04/0112345/a-new-kernel-is-out"
                "?utm_source=rss1.0mainlinkanon&utm_medium=feed",
                "BeauHD",
                None,
                "2025-03-04T01:00:00Z",  # +02:00 in the feed
                ["linux"],
            ),
        ],
    ),
    "rss091": (
        "scripting.rss091",
        "text/xml",  # no charset: the XML declaration says ISO-8859-1
        "rss091n",
        [
            (
                hashlib.sha256(
                    b"http://www.example.com/news/cafe.html\nCaf\xc3\xa9 opens in the lobby"
                ).hexdigest()[:32],
                "Caf\u00e9 opens in the lobby",
                "http://www.example.com/news/cafe.html",
                None,
                None,
                None,
                [],
            ),
            (
                hashlib.sha256(
                    b"http://www.example.com/news/server-move.html\nServer move on Sunday"
                ).hexdigest()[:32],
                "Server move on Sunday",
                "http://www.example.com/news/server-move.html",
                None,
                None,
                None,
                [],
            ),
        ],
    ),
    "atom_github_releases": (
        "github_releases.atom",
        ATOM,
        "atom10",
        [
            (
                f"tag:github.com,2008:Repository/123456789/{tag}",
                tag,
                f"https://github.com/acme/widgets/releases/tag/{tag}",
                author,
                None,  # GitHub's release feed has <updated> only
                updated,
                [],
            )
            for tag, author, updated in [
                ("v2.1.0", "octocat", "2025-03-04T12:30:05Z"),
                ("v2.0.1", "hubot", "2025-02-11T08:15:00Z"),
                ("v2.0.0", "octocat", "2025-01-20T17:00:00Z"),
            ]
        ],
    ),
    "atom_blog": (
        "blog.atom",
        ATOM,
        "atom10",
        [
            (
                "https://blog.example.org/posts/deprecating-v1/",
                "Deprecating the v1 API & what to do",  # type="html" title, as text
                "https://blog.example.org/posts/deprecating-v1/",  # relative, xml:base resolved
                "Grace Hopper",
                "2025-03-01T15:00:00Z",
                "2025-03-02T08:00:00Z",
                ["api", "deprecation"],
            ),
            (
                "https://blog.example.org/posts/faster-builds/",
                "Faster builds",
                "https://blog.example.org/posts/faster-builds/",
                "Platform Team",  # no entry author: the feed's
                "2025-02-14T12:00:00Z",
                "2025-02-14T12:00:00Z",
                ["ci"],
            ),
        ],
    ),
    "json_feed": (
        "jsonfeed.json",
        "application/feed+json",
        "json11",
        [
            (
                "https://micro.example.org/2025/03/04/analytical-engine.html",
                "Notes on the Analytical Engine",
                "https://micro.example.org/2025/03/04/analytical-engine.html",
                "A. A. Lovelace",
                "2025-03-04T09:00:00Z",
                "2025-03-04T12:30:00Z",  # -02:00 in the feed
                ["engines", "notes"],
            ),
            (
                "4711",
                None,
                "https://micro.example.org/2025/03/03/4711.html",
                "Ada Lovelace",  # the feed's authors
                "2025-03-03T20:15:00Z",
                "2025-03-03T20:15:00Z",
                [],
            ),
            (
                "episode-3",
                "Episode 3",
                "https://micro.example.org/podcast/3/",
                "Ada Lovelace",
                "2025-02-28T06:00:00Z",
                "2025-02-28T06:00:00Z",
                [],
            ),
        ],
    ),
}

FIELDS = ("entry_id", "title", "link", "author", "published_at", "updated_at", "tags")


@pytest.mark.parametrize("case", list(EXPECTED))
def test_each_format_gives_the_same_record_shape(api, case):
    fixture, content_type, version, expected = EXPECTED[case]
    serve(api, fixture, content_type)
    result = make_source(api).fetch(cursor=None)

    assert result.complete is False  # a feed is never a full listing: no deletes
    assert (result.pages, result.requests, result.not_modified) == (1, 1, False)
    assert result.notes == {"feed_version": version}
    records = result.records()
    assert result.record_count == len(records) == len(expected)
    assert [tuple(record[f] for f in FIELDS) for record in records] == expected
    for record in records:
        assert isinstance(record["summary"], str) and record["summary"]
        assert isinstance(record["content"], list) and isinstance(record["enclosures"], list)

    # The default config types every column.
    config = make_source(api).config
    frame = normalize(result, config, synced_at=datetime.now(UTC))
    assert frame.height == len(expected)
    assert frame.schema["published_at"] == pl.Datetime("us", "UTC")
    assert frame.schema["updated_at"] == pl.Datetime("us", "UTC")
    assert frame.schema["tags"] == pl.List(pl.String())
    rows = frame.select(FIELDS).rows()
    assert rows == [
        (*row[:4], *(at(v) if v else None for v in row[4:6]), row[6]) for row in expected
    ]


def test_extra_fields_keep_content_and_enclosures(api):
    serve(api, "github_blog.rss", RSS, "/blog")
    serve(api, "jsonfeed.json", "application/feed+json", "/json")
    serve(api, "blog.atom", ATOM, "/atom")
    rss = make_source(api, "/blog").fetch(cursor=None).records()
    assert rss[0]["content"] == [
        {
            "type": "text/html",
            "value": "<p>How we sign every artifact we ship, and how you can verify it.</p>",
        }
    ]
    assert rss[1]["enclosures"] == [
        {
            "href": "https://cdn.example.com/podcast/ep12.mp3",
            "type": "audio/mpeg",
            "length": 31457280,
        }
    ]
    json_feed = make_source(api, "/json").fetch(cursor=None).records()
    assert json_feed[1]["summary"] == "A short post with no title."  # content_text stands in
    assert json_feed[1]["content"] == [
        {"type": "text/plain", "value": "A short post with no title."}
    ]
    assert json_feed[2]["enclosures"] == [
        {"href": "https://cdn.example.org/ep3.mp3", "type": "audio/mpeg", "length": 23456789}
    ]
    atom = make_source(api, "/atom").fetch(cursor=None).records()
    # Relative links inside HTML content are resolved against xml:base.
    assert 'href="https://blog.example.org/docs/migrate/"' in atom[0]["content"][0]["value"]


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", "application/xml"])
def test_json_feed_is_recognized_by_its_version_whatever_the_content_type(api, content_type):
    serve(api, "jsonfeed.json", content_type)
    result = make_source(api).fetch(cursor=None)
    assert result.notes == {"feed_version": "json11"}
    assert [r["entry_id"] for r in result.records()][1:] == ["4711", "episode-3"]


def test_json_feed_1_0_and_loose_items(api):
    feed = {
        "version": "https://jsonfeed.org/version/1",
        "title": "Old style",
        "author": {"name": "Feed Author"},
        "items": [
            {"id": 17, "content_text": "numeric id", "date_published": "2025-01-02T03:04:05"},
            {"url": "https://e.org/no-id", "title": "No id", "date_modified": "not a date"},
            {"id": "x", "author": {"name": "Item Author"}, "tags": ["a", "a", " b ", 3]},
        ],
    }
    serve(api, Reply.json(feed).body, "application/feed+json")
    result = make_source(api).fetch(cursor=None)
    assert result.notes == {"feed_version": "json1"}
    first, second, third = result.records()
    assert (first["entry_id"], first["author"]) == ("17", "Feed Author")
    assert first["published_at"] == first["updated_at"] == "2025-01-02T03:04:05Z"  # no offset
    expected_id = hashlib.sha256(b"https://e.org/no-id\nNo id").hexdigest()[:32]
    assert (second["entry_id"], second["updated_at"]) == (expected_id, None)
    assert (third["author"], third["tags"]) == ("Item Author", ["a", "b"])


# --- ids, dates and hashes across polls -------------------------------------------------------


def test_entries_without_guid_get_a_stable_hash_id(api):
    serve(api, "no_guids.rss", RSS)
    source = make_source(api)
    first, second = source.fetch(cursor=None).records(), source.fetch(cursor=None).records()
    ids = [record["entry_id"] for record in first]
    assert ids == [record["entry_id"] for record in second]
    assert ids == [
        hashlib.sha256(f"{r['link']}\n{r['title']}".encode()).hexdigest()[:32] for r in first
    ]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == 2


@pytest.mark.parametrize("fixture", ["undated.rss", "scripting.rss091"])
def test_undated_entries_hash_the_same_on_every_poll(api, fixture):
    serve(api, fixture, "application/xml")
    source = make_source(api)
    hashes = []
    for synced_at in (datetime(2025, 3, 1, tzinfo=UTC), datetime(2025, 3, 2, tzinfo=UTC)):
        result = source.fetch(cursor=None)
        assert all(r["published_at"] is None and r["updated_at"] is None for r in result.records())
        frame = normalize(result, source.config, synced_at=synced_at)
        assert frame["updated_at"].null_count() == frame.height == 2
        hashes.append(frame[HASH_COLUMN].to_list())
    assert hashes[0] == hashes[1]


def rss(items: list[dict[str, str]]) -> bytes:
    """An RSS 2.0 document; each item's keys are element names (guid, title, pubDate...)."""
    body = "".join(
        "<item>" + "".join(f"<{k}>{v}</{k}>" for k, v in item.items()) + "</item>" for item in items
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><rss version="2.0"><channel><title>t</title>'
        f"<link>https://e.org/</link><description>d</description>{body}</channel></rss>"
    ).encode()


def test_duplicate_ids_in_one_document_keep_the_newest(api):
    serve(
        api,
        rss(
            [
                {"guid": "a", "title": "old", "pubDate": "Mon, 03 Mar 2025 10:00:00 GMT"},
                {"guid": "a", "title": "new", "pubDate": "Tue, 04 Mar 2025 10:00:00 GMT"},
                {"guid": "b", "title": "undated once"},
                {"guid": "b", "title": "undated twice"},
            ]
        ),
        RSS,
    )
    source = make_source(api)
    result = source.fetch(cursor=None)
    assert result.record_count == 4
    frame = normalize(result, source.config, synced_at=datetime.now(UTC))
    assert sorted(frame.select("entry_id", "title").rows()) == [
        ("a", "new"),
        ("b", "undated twice"),  # same (null) date: the later arrival wins
    ]


# --- a real sync ------------------------------------------------------------------------------


def test_rss_author_names_come_from_the_parenthesis(api, warehouse_url):
    authors = {
        "a": "x@host.example (Jane Doe)",  # a TLD feedparser's e-mail pattern does not know
        "b": "ci@builds.example.museum (Build (nightly) Bot)",
        "c": "bot@example.com (Release Bot)",
        "d": "ops@status.example",
        "e": "Plain Name",
    }
    items = [{"guid": guid, "title": guid, "author": author} for guid, author in authors.items()]
    serve(api, rss(items), RSS)
    with connect(warehouse_url) as wh:
        assert run_sync(wh, make_source(api)).inserted == 5
        assert wh.fetch("SELECT entry_id, author FROM feed_entries ORDER BY entry_id") == [
            ("a", "Jane Doe"),
            ("b", "Build (nightly) Bot"),
            ("c", "Release Bot"),
            ("d", "ops@status.example"),
            ("e", "Plain Name"),
        ]


def test_sync_inserts_then_nothing_then_only_the_new_entry(api, warehouse_url):
    items = [
        {
            "guid": f"post-{n}",
            "title": f"Post {n}",
            "link": f"https://e.org/{n}",
            "pubDate": f"Mon, 0{n} Mar 2025 10:00:00 GMT",
            "category": "news",
        }
        for n in (1, 2, 3)
    ]
    items.append({"guid": "undated", "title": "No date", "link": "https://e.org/undated"})
    current = {"items": items}
    api.route("/feed", lambda _request: Reply(200, rss(current["items"]), {"Content-Type": RSS}))
    source = make_source(api)

    with connect(warehouse_url) as wh:
        first = run_sync(wh, source)
        assert (first.inserted, first.updated, first.deleted) == (4, 0, 0)
        assert first.row_count == 4 and first.cursor_after == "2025-03-03T10:00:00Z"

        second = run_sync(wh, source)
        assert (second.inserted, second.updated, second.deleted, second.unchanged) == (0, 0, 0, 4)

        # The feed drops its oldest entry and shows a new one: one insert, no delete.
        newest = {
            "guid": "post-4",
            "title": "Post 4",
            "link": "https://e.org/4",
            "pubDate": "Tue, 04 Mar 2025 10:00:00 GMT",
        }
        current["items"] = [newest, *items[1:]]
        third = run_sync(wh, source)
        assert (third.inserted, third.updated, third.deleted) == (1, 0, 0)
        assert third.row_count == 5

        # An edited entry is an update.
        current["items"] = [{**newest, "title": "Post 4 (edited)"}, *items[1:]]
        assert (run_sync(wh, source).updated, run_sync(wh, source).changed) == (1, 0)

        table = wh.fetch_frame("SELECT * FROM feed_entries ORDER BY entry_id")
        assert table["entry_id"].to_list() == ["post-1", "post-2", "post-3", "post-4", "undated"]
        row = table.row(3, named=True)
        assert row["title"] == "Post 4 (edited)" and row["link"] == "https://e.org/4"
        assert row["published_at"] == datetime(2025, 3, 4, 10, tzinfo=UTC)
        assert list(table.row(0, named=True)["tags"]) == ["news"]
        assert table.row(4, named=True)["updated_at"] is None
        log = wh.fetch_frame("SELECT kind, object_key FROM feed_entries_changes")
        assert sorted(log["kind"].to_list()) == ["insert"] * 5 + ["update"]


# --- conditional requests ---------------------------------------------------------------------


def test_conditional_request_gets_not_modified(api):
    data = (FEEDS / "github_releases.atom").read_bytes()
    etag, modified = '"rel-9f1c"', "Tue, 04 Mar 2025 12:30:05 GMT"

    def handler(request: Received) -> Reply:
        if request.headers.get("if-none-match") == etag:
            return Reply(304, b"", {"ETag": etag})
        return Reply(200, data, {"Content-Type": ATOM, "ETag": etag, "Last-Modified": modified})

    api.route("/releases.atom", handler)
    source = make_source(api, "/releases.atom")
    url = source.config.url
    first = source.fetch(cursor=None)
    assert first.validators == {url: Validator(etag=etag, last_modified=modified)}
    assert first.record_count == 3 and not first.not_modified
    assert "if-none-match" not in api.received[0].headers

    second = source.fetch(cursor=None, validators=first.validators)
    assert second.not_modified is True
    assert (second.documents, second.pages, second.requests, second.complete) == ([], 1, 1, False)
    # The 304 repeated the ETag only; the stored Last-Modified is kept.
    assert second.validators == first.validators
    sent = api.received[1].headers
    assert sent["if-none-match"] == etag and sent["if-modified-since"] == modified
    assert "application/atom+xml" in sent["accept"]

    # Validators stored for another URL are not sent.
    other = source.fetch(cursor=None, validators={"https://elsewhere/feed": Validator(etag=etag)})
    assert not other.not_modified and "if-none-match" not in api.received[2].headers


def test_no_validators_when_the_server_sends_none(api):
    serve(api, "undated.rss", RSS)
    assert make_source(api).fetch(cursor=None).validators == {}


# --- auth, headers, errors --------------------------------------------------------------------


def test_query_auth_and_headers_are_sent_but_never_leak(api, monkeypatch):
    monkeypatch.setenv("FEED_TOKEN", SECRET)
    serve(
        api,
        rss([{"guid": "1", "title": "Relative", "link": "/posts/relative"}]),
        RSS,
        "/private.rss",
    )
    source = make_source(
        api,
        "/private.rss",
        headers={"Accept": "application/rss+xml", "X-Client": "changewatch"},
        auth={"type": "query", "name": "token", "value_env": "FEED_TOKEN"},
    )
    result = source.fetch(cursor=None)
    seen = api.received[0]
    assert seen.query == {"token": SECRET}
    assert seen.headers["accept"] == "application/rss+xml"  # the source's headers win
    assert seen.headers["x-client"] == "changewatch"
    # Relative links resolve against the feed's URL, without its query string.
    assert result.records()[0]["link"] == api.url("/posts/relative")
    assert SECRET not in str(result.records()) and SECRET not in str(result.validators)


def test_missing_credential_names_the_source(api, monkeypatch):
    monkeypatch.delenv("FEED_TOKEN", raising=False)
    source = make_source(api, auth={"type": "bearer", "token_env": "FEED_TOKEN"})
    with pytest.raises(FetchError, match="source 'acme_feed'.*FEED_TOKEN"):
        source.fetch(cursor=None)
    assert api.received == []


MALFORMED = {
    "truncated_xml": (
        b'<?xml version="1.0"?><rss version="2.0"><channel><title>Bro &nbsp',
        RSS,
        "is not a well-formed feed (<unknown>:1:77: unclosed token)",
    ),
    "html_page": (
        b"<!doctype html><html><body><p>Moved!</p></body></html>",
        "text/html",
        "is not an RSS, Atom or JSON feed (text/html)",
    ),
    "json_not_a_feed": (
        b'{"data": [{"id": 1}]}',
        "application/json",
        "is JSON but not a JSON Feed (no version https://jsonfeed.org/version/...)",
    ),
    "json_garbage": (b"{not json", "application/feed+json", "is neither JSON nor an RSS/Atom feed"),
    "json_items_not_a_list": (
        b'{"version": "https://jsonfeed.org/version/1.1", "items": 3}',
        "application/json",
        "is a JSON Feed whose items are not a list of objects",
    ),
    "empty_body": (b"", RSS, "is empty"),
    # feedparser reads a bytes argument naming a file as that file: the body must never be one.
    "body_names_a_file": (
        str(FEEDS / "undated.rss").encode(),
        "text/plain",
        "is not an RSS, Atom or JSON feed (text/plain)",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_feed_raises_payload_error(api, monkeypatch, case):
    monkeypatch.setenv("FEED_TOKEN", SECRET)
    body, content_type, problem = MALFORMED[case]
    serve(api, body, content_type, "/broken.xml")
    source = make_source(
        api, "/broken.xml", auth={"type": "query", "name": "token", "value_env": "FEED_TOKEN"}
    )
    with pytest.raises(PayloadError) as caught:
        source.fetch(cursor=None)
    message = str(caught.value)
    assert message.startswith("source 'acme_feed': GET 127.0.0.1/broken.xml ")
    assert message.endswith(problem)
    assert SECRET not in message and "?token" not in message


def test_http_errors_are_fetch_errors(api):
    with pytest.raises(FetchError, match="acme_feed: GET 127.0.0.1/missing.xml gave HTTP 404"):
        make_source(api, "/missing.xml").fetch(cursor=None)


def test_an_empty_but_valid_feed_is_zero_records(api):
    serve(api, rss([]), RSS)
    result = make_source(api).fetch(cursor=None)
    assert result.records() == [] and result.record_count == 0 and result.notes["feed_version"]
