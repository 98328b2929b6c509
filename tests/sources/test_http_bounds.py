"""HTTP sources bound what they accept: credentials stay with their origin across redirects,
responses are capped in size and time, and a whole sync in time and pages."""

from __future__ import annotations

import base64
import functools
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from apiserver import Received
from changewatch.pipeline.project.expected_errors import ConfigError
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources.errors import FetchError, LimitExceeded, RateLimited
from changewatch.sources.feed import build_feed_source
from changewatch.sources.github import build_github_source
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.limits import DEFAULT_PAGE_LIMIT
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from wireserver import (
    WireServer,
    drip_route,
    endless_route,
    gzip_bomb,
    gzip_route,
    json_route,
    redirect_route,
    send,
)

KEY, USER, PASSWORD = "s3cret-key", "alice", "s3cret-pass"
AUTHS: dict[str, dict[str, str]] = {
    "bearer": {"type": "bearer", "token_env": "CW_TEST_BOUNDS_KEY"},
    "basic": {
        "type": "basic",
        "username_env": "CW_TEST_BOUNDS_USER",
        "password_env": "CW_TEST_BOUNDS_PASSWORD",
    },
    "header": {"type": "header", "name": "X-Api-Key", "value_env": "CW_TEST_BOUNDS_KEY"},
    "query": {"type": "query", "name": "api_key", "value_env": "CW_TEST_BOUNDS_KEY"},
}
# Every form a credential takes on the wire (basic auth's is base64).
SECRETS = [KEY, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(), "s3cret-cookie"]


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CW_TEST_BOUNDS_KEY", KEY)
    monkeypatch.setenv("CW_TEST_BOUNDS_USER", USER)
    monkeypatch.setenv("CW_TEST_BOUNDS_PASSWORD", PASSWORD)


def rest_source(base_url: str, **settings: Any) -> RestSource:
    config = {
        "name": "acme_items",
        "type": "rest",
        "table": "items",
        "primary_key": "id",
        "columns": {"id": "bigint", "updated_at": "timestamp"},
        "base_url": base_url,
        "path": "/items",
        **settings,
    }
    factory = functools.partial(HttpClient, sleep=[].append)
    return RestSource(
        RestSourceConfig.model_validate(config),
        policy=HttpPolicy(max_retries=0),
        client_factory=factory,
    )


def leaked(request: Received) -> list[str]:
    """The credentials ``request`` carried, in any header or query parameter."""
    values = [*request.headers.values(), *request.query.values()]
    return [secret for secret in SECRETS if any(secret in value for value in values)]


def copying_query(server: WireServer, path: str):
    """A redirect to ``path`` on ``server`` that copies the query string, as CDNs do."""

    def location(request: Received) -> str:
        query = "&".join(f"{k}={v}" for k, v in request.query.items())
        return server.url(path) + (f"?{query}" if query else "")

    return location


# --- credentials and redirects ----------------------------------------------------------------


@pytest.mark.parametrize("auth", sorted(AUTHS))
def test_redirect_to_another_origin_carries_no_credential(auth: str) -> None:
    with WireServer() as api, WireServer() as elsewhere:
        # The API sets a cookie and sends the client on to another port of the same host.
        api.routes["/items"] = redirect_route(
            copying_query(elsewhere, "/items"), Set_Cookie="session=s3cret-cookie; Path=/"
        )
        elsewhere.routes["/items"] = json_route([{"id": 1}])
        result = rest_source(api.base_url, auth=AUTHS[auth]).fetch(cursor=None)
        assert result.records() == [{"id": 1}]
        assert leaked(api.received[0]) != []  # the credential did go to its own origin
        assert [leaked(request) for request in elsewhere.received] == [[]]
        assert "cookie" not in elsewhere.received[0].headers


def test_redirect_within_the_origin_keeps_the_credential() -> None:
    with WireServer() as api:
        api.routes["/items"] = redirect_route(lambda _request: "/v2/items")
        api.routes["/v2/items"] = json_route([{"id": 2}])
        source = rest_source(api.base_url, auth=AUTHS["header"])
        assert source.fetch(cursor=None).records() == [{"id": 2}]
        assert [r.path for r in api.received] == ["/items", "/v2/items"]
        assert api.received[1].headers["x-api-key"] == KEY


def test_once_off_the_origin_a_redirect_back_brings_no_credential() -> None:
    with WireServer() as api, WireServer() as elsewhere:
        api.routes["/items"] = redirect_route(lambda _request: elsewhere.url("/hop"))
        elsewhere.routes["/hop"] = redirect_route(lambda _request: api.url("/v2/items"))
        api.routes["/v2/items"] = json_route([{"id": 3}])
        source = rest_source(api.base_url, auth=AUTHS["header"])
        assert source.fetch(cursor=None).records() == [{"id": 3}]
        assert [leaked(r) for r in [*elsewhere.received, api.received[1]]] == [[], []]


def test_github_token_stays_with_the_api() -> None:
    with WireServer() as api, WireServer() as elsewhere:
        path = "/repos/acme/widgets/issues"
        api.routes[path] = redirect_route(copying_query(elsewhere, path))
        elsewhere.routes[path] = json_route([])
        config = {
            "name": "gh",
            "type": "github",
            "table": "issues",
            "repos": ["acme/widgets"],
            "token_env": "CW_TEST_BOUNDS_KEY",
            "base_url": api.base_url,
        }
        factory = functools.partial(HttpClient, sleep=[].append)
        source = build_github_source(config, client_factory=factory)
        assert source.fetch(cursor=None).records() == []
        assert api.received[0].headers["authorization"] == f"Bearer {KEY}"
        assert [leaked(request) for request in elsewhere.received] == [[]]


def test_redirects_are_bounded() -> None:
    with WireServer() as api:
        api.routes["/items"] = redirect_route(lambda _request: "/items")
        with pytest.raises(FetchError, match="more than max_redirects=10 redirects"):
            rest_source(api.base_url).fetch(cursor=None)
        assert len(api.received) == 11


# --- size -------------------------------------------------------------------------------------


def _peak_while(call) -> tuple[BaseException, int]:
    """The exception ``call()`` raises and the peak of Python memory it allocated meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceeded) as error:
            call()
        return error.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_endless_response_stops_at_max_response_bytes() -> None:
    with WireServer() as api:
        api.routes["/items"] = endless_route()
        source = rest_source(api.base_url, max_response_bytes="1MiB", auth=AUTHS["query"])
        error, peak = _peak_while(lambda: source.fetch(cursor=None))
    message = str(error)
    assert message.startswith("acme_items: GET 127.0.0.1/items: the response passed ")
    assert "max_response_bytes (1 MiB)" in message and "\n" not in message
    assert KEY not in message
    # The body read stopped near the cap; an uncapped read would hold it all and grow.
    assert peak < 8 << 20


def test_a_gzip_bomb_is_counted_after_inflation() -> None:
    bomb = gzip_bomb(100 << 20)
    assert len(bomb) < 200 << 10  # 100 MiB of spaces in about 100 KB on the wire
    with WireServer() as api:
        api.routes["/items"] = gzip_route(bomb)
        source = rest_source(api.base_url, max_response_bytes="2MiB")
        error, peak = _peak_while(lambda: source.fetch(cursor=None))
    assert "max_response_bytes (2 MiB)" in str(error)
    # Inflated a step at a time: httpx inflates each 64 KiB read whole, some 64 MiB here.
    assert peak < 8 << 20


def test_a_feed_goes_through_the_same_cap() -> None:
    item = b"<item><guid>%d</guid><title>entry</title></item>"
    feed = b"<rss version='2.0'><channel>" + b"".join(item % i for i in range(2000))
    with WireServer() as api:
        api.routes["/feed"] = lambda handler, _request: send(
            handler, 200, feed + b"</channel></rss>", Content_Type="application/rss+xml"
        )
        config = {"name": "acme_feed", "type": "feed", "table": "entries"}
        config |= {"url": api.url("/feed"), "max_response_bytes": "32KiB"}
        source = build_feed_source(config, policy=HttpPolicy(max_retries=0))
        with pytest.raises(LimitExceeded, match=r"acme_feed: GET 127\.0\.0\.1/feed: .*32 KiB"):
            source.fetch(cursor=None)
        # Within its cap the same feed is read whole.
        config["max_response_bytes"] = "1MiB"
        assert len(build_feed_source(config).fetch(cursor=None).records()) == 2000


def test_a_feed_of_a_million_entries_stops_before_parsing() -> None:
    item = b"<item><guid>%d</guid></item>"
    feed = b"<rss version='2.0'><channel>%s</channel></rss>" % b"".join(
        item % i for i in range(1_000_000)
    )
    with WireServer() as api:
        api.routes["/feed"] = lambda handler, _request: send(
            handler, 200, feed, Content_Type="application/rss+xml"
        )
        config = {"name": "acme_feed", "type": "feed", "table": "entries", "url": api.url("/feed")}
        source = build_feed_source(config, policy=HttpPolicy(max_retries=0))
        assert source.config.max_entries == 10_000
        error, peak = _peak_while(lambda: source.fetch(cursor=None))
    assert str(error) == (
        "source 'acme_feed': GET 127.0.0.1/feed: the feed lists more than max_entries=10000 "
        "entries; raise the source's max_entries if it really lists that many"
    )
    # The body (some 30 MB) is read, but feedparser never builds its million entries (1 GB).
    assert len(feed) < 32 << 20 and peak < 4 * len(feed)


def test_a_json_feed_has_the_same_entry_cap() -> None:
    items = [{"id": str(i), "title": f"entry {i}"} for i in range(30)]
    body = {"version": "https://jsonfeed.org/version/1.1", "title": "x", "items": items}
    with WireServer() as api:
        api.routes["/feed.json"] = json_route(body)
        config = {"name": "acme_feed", "type": "feed", "table": "entries"}
        config |= {"url": api.url("/feed.json"), "max_entries": 20}
        with pytest.raises(LimitExceeded, match="more than max_entries=20 entries"):
            build_feed_source(config).fetch(cursor=None)
        config["max_entries"] = 30
        assert len(build_feed_source(config).fetch(cursor=None).records()) == 30


# --- time -------------------------------------------------------------------------------------


def test_a_dripping_response_stops_at_response_timeout() -> None:
    timeout = 0.5
    with WireServer() as api:
        api.routes["/items"] = drip_route(every=timeout / 10)
        source = rest_source(api.base_url, response_timeout=f"{timeout * 1000:g}ms")
        started = time.monotonic()
        with pytest.raises(LimitExceeded) as error:
            source.fetch(cursor=None)
        elapsed = time.monotonic() - started
    message = str(error.value)
    assert message.startswith("acme_items: GET 127.0.0.1/items: the response took longer than ")
    assert "response_timeout (0.5s)" in message
    # It waited out the deadline (each byte comes well within httpx's per-read timeout)...
    assert elapsed >= timeout
    # ...and no more than one retry-free request: the drip never ends by itself.
    assert len(api.received) == 1


def test_a_walk_stops_at_sync_timeout() -> None:
    with WireServer() as api:
        served: list[float] = []

        def page(handler, request: Received) -> None:
            # Every page is quick, and links to one more: only the sync's deadline ends it.
            served.append(time.monotonic())
            number = int(request.query.get("page", "1"))
            link = f'<{api.url("/items")}?page={number + 1}>; rel="next"'
            send(handler, 200, b'[{"id": %d}]' % number, Link=link)

        api.routes["/items"] = page
        limit = 1.0
        source = rest_source(api.base_url, paginator={"type": "link_header"}, sync_timeout=limit)
        started = time.monotonic()
        with pytest.raises(LimitExceeded, match=r"sync_timeout \(1s\)") as error:
            source.fetch(cursor=None)
        assert time.monotonic() - started >= limit
        assert str(error.value).startswith("acme_items: GET 127.0.0.1/items: the sync passed ")
        # Pages were coming the whole time: it was the deadline, not a failure, that stopped it.
        assert len(served) > 2 and served[-1] - started < limit


def test_a_github_sync_timeout_spans_every_repository() -> None:
    delay = 1.0  # each repository answers after this long

    def slow(handler, _request: Received) -> None:
        time.sleep(delay)
        send(handler, 200, b"[]")

    with WireServer() as api:
        for repo in ("one", "two"):
            api.routes[f"/repos/acme/{repo}/issues"] = slow
        config = {
            "name": "gh",
            "type": "github",
            "table": "issues",
            "repos": ["acme/one", "acme/two"],
            "base_url": api.base_url,
            # Either repository fits in it; both (at least 2 * delay) cannot.
            "sync_timeout": 1.8 * delay,
        }
        source = build_github_source(config, policy=HttpPolicy(max_retries=0))
        with pytest.raises(LimitExceeded) as error:
            source.fetch(cursor=None)
    assert str(error.value).startswith("gh: GET 127.0.0.1/repos/acme/two/issues: the sync passed")
    assert "sync_timeout (1.8s)" in str(error.value)
    assert [r.path.split("/")[3] for r in api.received] == ["one", "two"]


@pytest.mark.parametrize(
    ("status", "error"),
    # A rate limit for 30 s (the policy would wait up to 60 s); a 503 retried after a backoff
    # of 8 s or more. Either wait would end past the sync's 5 s.
    [(429, RateLimited), (503, LimitExceeded)],
)
def test_no_wait_goes_past_sync_timeout(status: int, error: type[Exception]) -> None:
    sleeps: list[float] = []
    with WireServer() as api:
        limited = {"Retry_After": "30"} if status == 429 else {}
        api.routes["/items"] = lambda handler, _request: send(handler, status, b"{}", **limited)
        config = RestSourceConfig.model_validate(
            {"name": "acme_items", "type": "rest", "table": "items", "primary_key": "id"}
            | {"columns": {"id": "bigint"}, "base_url": api.base_url, "path": "/items"}
            | {"sync_timeout": 5}
        )
        source = RestSource(
            config,
            policy=HttpPolicy(max_retries=3, backoff_base=16.0),
            client_factory=functools.partial(HttpClient, sleep=sleeps.append),
        )
        with pytest.raises(error, match=r"sync_timeout"):
            source.fetch(cursor=None)
    # It did not wait: the sync is deferred (rate limit) or failed (5xx) at once.
    assert sleeps == [] and len(api.received) == 1


# --- pages and settings -----------------------------------------------------------------------


def test_page_limit_has_a_default_and_names_the_listing() -> None:
    with WireServer() as api:

        def page(handler, request: Received) -> None:
            number = int(request.query.get("page", "1"))
            send(handler, 200, b"[]", Link=f'<{api.url("/items")}?page={number + 1}>; rel="next"')

        api.routes["/items"] = page
        assert rest_source(api.base_url).config.page_limit == DEFAULT_PAGE_LIMIT == 50_000
        source = rest_source(api.base_url, paginator={"type": "link_header"}, page_limit=3)
        with pytest.raises(LimitExceeded) as error:
            source.fetch(cursor=None)
    assert str(error.value).startswith(
        "source 'acme_items': GET 127.0.0.1/items: more than page_limit=3 pages"
    )
    assert len(api.received) == 3


def test_bad_limits_name_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "watches.yaml"
    path.write_text(
        "sources:\n"
        "  - name: items\n"
        "    type: rest\n"
        "    base_url: http://127.0.0.1:1\n"
        "    table: items\n"
        "    primary_key: id\n"
        "    columns: {id: bigint}\n"
        "    max_response_bytes: lots\n"
        "    sync_timeout: -5\n"
    )
    with pytest.raises(ConfigError) as error:
        load_config(path)
    lines = str(error.value).splitlines()
    assert lines[0].startswith(f"{path}:8: sources[0].max_response_bytes: ")
    assert "'lots' is not a size" in lines[0]
    assert lines[1].startswith(f"{path}:9: sources[0].sync_timeout: ")


# --- a failed sync stores nothing -------------------------------------------------------------


def test_a_sync_past_a_limit_keeps_the_stored_rows_and_cursor(warehouse_url: str) -> None:
    with WireServer() as api:
        api.routes["/items"] = json_route(
            [{"id": 1, "updated_at": "2026-01-01T00:00:00Z"}], ETag='"v1"'
        )
        settings: dict[str, Any] = {"sync": "incremental", "incremental": {"param": "since"}}
        settings |= {"updated_at": "updated_at", "max_response_bytes": "1MiB"}
        with connect(warehouse_url) as wh:
            assert run_sync(wh, rest_source(api.base_url, **settings)).inserted == 1
            rows = wh.fetch("SELECT id, updated_at FROM items")
            state = wh.fetch("SELECT * FROM sync_state")
            api.routes["/items"] = endless_route()
            with pytest.raises(LimitExceeded, match="max_response_bytes"):
                run_sync(wh, rest_source(api.base_url, **settings))
            assert wh.fetch("SELECT id, updated_at FROM items") == rows
            assert wh.fetch("SELECT * FROM sync_state") == state
            status, error = wh.fetch(
                "SELECT status, error FROM sync_runs ORDER BY started_at DESC LIMIT 1"
            )[0]
            assert status == "failed" and "max_response_bytes" in error
