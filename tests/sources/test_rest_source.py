"""RestSource against a real loopback server: every paginator, auth, incremental and errors."""

from __future__ import annotations

import base64
import functools
from typing import Any

import httpx
import pytest
from apiserver import ApiServer, Received, Reply
from changewatch.sources.base import Validator
from changewatch.sources.errors import FetchError, PayloadError, SourceError
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.rest import RestSource, RestSourceConfig, build_rest_source
from changewatch.sources.rest.paginators import PageRequest
from changewatch.sources.rest.source import request_key
from pydantic import ValidationError

SECRET = "tok-9f8e7d6c5b4a"


@pytest.fixture
def api():
    with ApiServer() as server:
        yield server


def items(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "title": f"item {i}"} for i in range(n)]


def make_source(api: ApiServer, delays: list[float] | None = None, **settings: Any) -> RestSource:
    """A source named ``acme_items`` reading ``/items``; sleeps go to ``delays``."""
    config = {
        "name": "acme_items",
        "type": "rest",
        "table": "items",
        "primary_key": "id",
        "columns": {"id": "bigint", "title": "text", "updated_at": "timestamp"},
        "base_url": api.base_url,
        "path": "items",
        **settings,
    }
    factory = functools.partial(HttpClient, sleep=(delays if delays is not None else []).append)
    return build_rest_source(config, policy=HttpPolicy(max_retries=1), client_factory=factory)


def ids(result) -> list[int]:
    return [record["id"] for record in result.records()]


# --- paginators -------------------------------------------------------------------------------


@pytest.mark.parametrize(("total", "requests"), [(25, 3), (20, 3), (0, 1)])
def test_page_number_stops_on_a_short_or_empty_page(api, total, requests):
    data = items(total)

    def handler(request: Received) -> Reply:
        page, size = int(request.query["page"]), int(request.query["per_page"])
        return Reply.json(data[(page - 1) * size : page * size])

    api.route("/items", handler)
    paginator = {"type": "page_number", "page_size_param": "per_page", "page_size": 10}
    result = make_source(api, paginator=paginator, params={"state": "all"}).fetch(cursor=None)
    assert ids(result) == list(range(total))
    assert result.pages == result.requests == requests
    assert result.complete is True
    assert [r.query["page"] for r in api.received] == [str(p) for p in range(1, requests + 1)]
    assert all(r.query["state"] == "all" for r in api.received)


def test_page_number_with_total_pages_and_records_path(api):
    data = items(7)

    def handler(request: Received) -> Reply:
        page = int(request.query["p"])
        return Reply.json({"data": {"items": data[page * 3 : page * 3 + 3]}, "meta": {"pages": 3}})

    api.route("/items", handler)
    paginator = {
        "type": "page_number",
        "page_param": "p",
        "start": 0,
        "stop_on_empty": False,
        "total_pages_path": "meta.pages",
    }
    result = make_source(api, paginator=paginator, records_path="data.items").fetch(cursor=None)
    assert ids(result) == list(range(7))
    assert result.pages == 3


@pytest.mark.parametrize(("total_path", "requests"), [(None, 3), ("total", 2)])
def test_offset_collects_every_record_once(api, total_path, requests):
    data = items(200)

    def handler(request: Received) -> Reply:
        offset, limit = int(request.query["skip"]), int(request.query["take"])
        return Reply.json({"results": data[offset : offset + limit], "total": len(data)})

    api.route("/items", handler)
    paginator = {"type": "offset", "offset_param": "skip", "limit_param": "take", "limit": 100}
    if total_path:
        paginator["total_path"] = total_path
    result = make_source(api, paginator=paginator, records_path="results").fetch(cursor=None)
    assert ids(result) == list(range(200))
    assert result.requests == requests
    assert [r.query["skip"] for r in api.received] == ["0", "100", "200"][:requests]


def test_link_header_follows_rel_next_like_github(api):
    data = items(5)

    def handler(request: Received) -> Reply:
        page = int(request.query.get("page", "1"))
        links = [f'<{api.url("/items")}?per_page=2&page=5>; rel="last"']
        if page < 3:
            links.insert(0, f'<{api.url("/items")}?per_page=2&page={page + 1}>; rel="next"')
        return Reply.json(data[(page - 1) * 2 : page * 2], Link=", ".join(links))

    api.route("/items", handler)
    source = make_source(api, paginator={"type": "link_header"}, params={"per_page": 2})
    result = source.fetch(cursor=None)
    assert ids(result) == list(range(5))
    assert result.pages == 3
    assert [r.query.get("page") for r in api.received] == [None, "2", "3"]


def test_link_header_loop_is_detected(api):
    def handler(request: Received) -> Reply:
        # Page 2 points back to page 1: following it would never end.
        target = "?page=2" if request.query.get("page") != "2" else "?page=1"
        return Reply.json(items(1), Link=f'<{api.url("/items")}{target}>; rel="next"')

    api.route("/items", handler)
    source = make_source(api, paginator={"type": "link_header"}, params={"page": 1})
    with pytest.raises(FetchError, match="loop") as info:
        source.fetch(cursor=None)
    assert "acme_items" in str(info.value)
    assert len(api.received) == 2


def test_next_url_follows_absolute_and_relative_urls(api):
    pages = {
        "1": {"results": items(2), "next": api.url("/items?page=2")},
        "2": {"results": items(4)[2:], "next": "/items?page=3"},
        "3": {"results": items(5)[4:], "next": None},
    }
    api.route("/items", lambda request: Reply.json(pages[request.query.get("page", "1")]))
    source = make_source(api, paginator={"type": "next_url"}, records_path="results")
    result = source.fetch(cursor=None)
    assert ids(result) == list(range(5))
    assert result.pages == 3


def test_cursor_sends_the_next_cursor_back_until_empty(api):
    pages = {
        "": {"items": items(2), "meta": {"next_cursor": "c2"}},
        "c2": {"items": items(4)[2:], "meta": {"next_cursor": "c3"}},
        "c3": {"items": items(6)[4:], "meta": {"next_cursor": ""}},
    }
    api.route("/items", lambda request: Reply.json(pages[request.query.get("after", "")]))
    paginator = {"type": "cursor", "cursor_path": "meta.next_cursor", "cursor_param": "after"}
    result = make_source(api, paginator=paginator, records_path="items").fetch(cursor=None)
    assert ids(result) == list(range(6))
    assert [r.query.get("after") for r in api.received] == [None, "c2", "c3"]


def test_a_repeated_cursor_is_a_loop(api):
    api.route("/items", lambda request: Reply.json({"items": items(1), "next_cursor": "same"}))
    source = make_source(api, paginator={"type": "cursor"}, records_path="items")
    with pytest.raises(FetchError, match="loop"):
        source.fetch(cursor=None)


def test_page_limit_raises_instead_of_truncating(api):
    api.route("/items", lambda request: Reply.json(items(10)))
    paginator = {"type": "page_number", "page_size": 10}
    with pytest.raises(FetchError, match="page_limit=2"):
        make_source(api, paginator=paginator, page_limit=2).fetch(cursor=None)
    assert len(api.received) == 2


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [404, 500])
def test_an_error_on_a_middle_page_fails_the_whole_fetch(api, status):
    def handler(request: Received) -> Reply:
        if request.query["page"] == "2":
            return Reply.json({"message": "boom"}, status=status)
        return Reply.json(items(10))

    api.route("/items", handler)
    delays: list[float] = []
    source = make_source(api, delays, paginator={"type": "page_number", "page_size": 10})
    with pytest.raises(FetchError, match=str(status)) as info:
        source.fetch(cursor=None)
    assert "acme_items" in str(info.value) and "/items" in str(info.value)
    assert len(delays) == (1 if status == 500 else 0)


def test_non_json_body_is_a_payload_error_naming_the_source(api):
    api.queue("/items", Reply(200, b"<html>maintenance</html>", {"Content-Type": "text/html"}))
    with pytest.raises(PayloadError, match="acme_items.*page 1.*not return JSON.*text/html"):
        make_source(api).fetch(cursor=None)


@pytest.mark.parametrize(
    ("body", "records_path", "problem"),
    [
        ({"data": {"id": 1}}, "data", "records_path 'data' is an object"),
        ({"data": [1, 2]}, "data", "non-objects"),
        ({"rows": []}, "data", "records_path 'data' is missing.*top-level keys: rows"),
        ({"data": []}, None, "the body is an object.*top-level keys: data"),
    ],
)
def test_records_path_must_lead_to_a_list_of_objects(api, body, records_path, problem):
    api.queue("/items", Reply.json(body))
    with pytest.raises(PayloadError, match=f"acme_items.*page 1.*{problem}"):
        make_source(api, records_path=records_path).fetch(cursor=None)


# --- auth -------------------------------------------------------------------------------------


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


AUTH_CASES = [
    ({"type": "bearer", "token_env": "ACME_TOKEN"}, "authorization", f"Bearer {SECRET}"),
    (
        {"type": "basic", "username_env": "ACME_USER", "password_env": "ACME_TOKEN"},
        "authorization",
        _basic("robot", SECRET),
    ),
    ({"type": "header", "value_env": "ACME_TOKEN"}, "x-api-key", SECRET),
    ({"type": "query", "name": "key", "value_env": "ACME_TOKEN"}, "?key", SECRET),
]


@pytest.mark.parametrize(("auth", "where", "expected"), AUTH_CASES)
def test_auth_reaches_every_page_from_the_environment(api, monkeypatch, auth, where, expected):
    monkeypatch.setenv("ACME_TOKEN", SECRET)
    monkeypatch.setenv("ACME_USER", "robot")

    def handler(request: Received) -> Reply:
        link = {} if request.query.get("page") else {"Link": '</items?page=2>; rel="next"'}
        return Reply.json(items(1), **link)

    api.route("/items", handler)
    make_source(api, auth=auth, paginator={"type": "link_header"}).fetch(cursor=None)
    assert len(api.received) == 2
    for request in api.received:
        seen = request.query.get(where[1:]) if where.startswith("?") else request.headers.get(where)
        assert seen == expected


@pytest.mark.parametrize(("auth", "where", "expected"), AUTH_CASES)
def test_a_rejected_secret_never_appears_in_the_error(api, monkeypatch, auth, where, expected):
    monkeypatch.setenv("ACME_TOKEN", SECRET)
    monkeypatch.setenv("ACME_USER", "robot")
    api.route("/items", lambda request: Reply.json({"message": "Bad credentials"}, status=401))
    with pytest.raises(FetchError, match="401") as info:
        make_source(api, auth=auth).fetch(cursor=None)
    assert SECRET not in str(info.value)
    assert expected.split()[-1] not in str(info.value)


def test_missing_env_var_names_the_variable(api, monkeypatch):
    monkeypatch.delenv("ACME_TOKEN", raising=False)
    source = make_source(api, auth={"type": "bearer", "token_env": "ACME_TOKEN"})
    with pytest.raises(FetchError, match="acme_items.*ACME_TOKEN"):
        source.fetch(cursor=None)
    assert api.received == []


def test_env_vars_lists_auth_variable_names(api):
    basic = {"type": "basic", "username_env": "ACME_USER", "password_env": "ACME_PASS"}
    assert make_source(api, auth=basic).config.env_vars() == ["ACME_USER", "ACME_PASS"]
    assert make_source(api).config.env_vars() == []


# --- incremental ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sync", "cursor", "fmt", "sent"),
    [
        ("incremental", "2024-05-01T12:00:00Z", "iso", "2024-05-01T12:00:00Z"),
        ("incremental", "2024-05-01T12:00:00+00:00", "unix", "1714564800"),
        ("incremental", "2024-05-01T12:00:00", "unix", "1714564800"),
        ("incremental", None, "iso", None),
        ("snapshot", "2024-05-01T12:00:00Z", "iso", None),
    ],
)
def test_incremental_param_only_with_incremental_sync_and_a_cursor(api, sync, cursor, fmt, sent):
    api.queue("/items", Reply.json(items(2)))
    settings = {"sync": sync, "updated_at": "updated_at"}
    source = make_source(api, incremental={"param": "since", "format": fmt}, **settings)
    result = source.fetch(cursor=cursor)
    assert api.received[0].query.get("since") == sent
    assert result.complete is (sync == "snapshot")


def test_a_cursor_that_is_not_iso_fails_before_any_request(api):
    settings = {"sync": "incremental", "updated_at": "updated_at"}
    source = make_source(api, incremental={"format": "unix"}, **settings)
    with pytest.raises(SourceError, match="acme_items.*not an ISO-8601"):
        source.fetch(cursor="yesterday")
    assert api.received == []


# --- config -----------------------------------------------------------------------------------

BASE = {
    "name": "gh_issues",
    "type": "rest",
    "table": "issues",
    "primary_key": "id",
    "columns": {"id": "bigint", "updated_at": "timestamp"},
    "base_url": "https://api.github.com",
}


def test_config_defaults_and_url():
    config = RestSourceConfig.model_validate({**BASE, "path": "/repos/o/r/issues"})
    assert config.paginator.type == "none"
    assert config.auth is None and config.incremental is None
    assert config.url == "https://api.github.com/repos/o/r/issues"


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"base_url": "ftp://example.com"}, "http"),
        ({"base_url": "https://example.com/?key=1"}, "query string"),
        ({"headers": {"Authorization": "token abc"}}, "credentials"),
        ({"auth": {"type": "bearer", "token_env": "ghp_abc123"}}, "environment variable name"),
        ({"sync": "incremental", "updated_at": "updated_at"}, "needs incremental"),
        ({"paginator": {"type": "page_number", "stop_on_empty": False}}, "total_pages_path"),
        ({"paginator": {"type": "pages"}}, "paginator"),
        ({"type": "graphql"}, "rest"),
        ({"surprise": 1}, "Extra inputs"),
    ],
)
def test_config_rejects(settings, problem):
    with pytest.raises(ValidationError, match=problem):
        RestSourceConfig.model_validate({**BASE, **settings})


# --- conditional requests ---------------------------------------------------------------------


def _etagged(pages: dict[str, list[dict[str, Any]]], link: bool = True):
    """A Link-header listing with an ETag per page and 304 on a matching If-None-Match."""

    def handler(request: Received) -> Reply:
        page = request.query.get("page", "1")
        etag = f'"{page}-{len(pages[page])}"'
        headers = {"ETag": etag}
        if link and str(int(page) + 1) in pages:
            headers["Link"] = f'</items?page={int(page) + 1}>; rel="next"'
        if request.headers.get("if-none-match") == etag:
            return Reply(304, b"", headers)
        return Reply.json(pages[page], **headers)

    return handler


def test_snapshot_all_304_is_not_modified(api, monkeypatch):
    monkeypatch.setenv("ACME_TOKEN", SECRET)
    api.route("/items", _etagged({"1": items(2), "2": items(1)}))
    auth = {"type": "query", "name": "key", "value_env": "ACME_TOKEN"}
    source = make_source(api, paginator={"type": "link_header"}, auth=auth)
    first = source.fetch(cursor=None)
    assert first.complete is True and len(first.validators) == 2
    assert all(SECRET not in key and "key=" not in key for key in first.validators)
    again = source.fetch(cursor=None, validators=first.validators)
    assert again.not_modified is True and again.complete is False
    assert again.documents == [] and again.pages == 2
    assert [r.headers.get("if-none-match") for r in api.received[2:]] == ['"1-2"', '"2-1"']


def test_snapshot_partly_304_fetches_the_304_pages_again(api):
    pages = {"1": items(2), "2": items(1)}
    api.route("/items", _etagged(pages))
    source = make_source(api, paginator={"type": "link_header"})
    first = source.fetch(cursor=None)
    pages["2"] = items(3)[1:]
    again = source.fetch(cursor=None, validators=first.validators)
    assert again.complete is True and again.not_modified is False
    assert ids(again) == [0, 1, 1, 2]  # page 1 again (unconditionally), then page 2
    assert again.pages == 2 and again.requests == 3
    assert "if-none-match" not in api.received[-1].headers


def test_incremental_first_page_304_is_done(api):
    api.route("/items", _etagged({"1": items(2)}))
    settings = {"sync": "incremental", "updated_at": "updated_at", "incremental": {}}
    source = make_source(api, paginator={"type": "none"}, **settings)
    first = source.fetch(cursor="2024-05-01T00:00:00Z")
    [key] = first.validators
    assert "since=2024-05-01T00%3A00%3A00Z" in key
    again = source.fetch(cursor="2024-05-01T00:00:00Z", validators=first.validators)
    assert again.not_modified is True and again.documents == [] and again.requests == 1
    # Another cursor is another request: its validator does not apply.
    other = source.fetch(cursor="2024-05-02T00:00:00Z", validators=first.validators)
    assert other.not_modified is False and "if-none-match" not in api.received[-1].headers


def test_body_paginators_send_no_validators(api):
    api.route("/items", lambda request: Reply.json(items(1), ETag='"x"'))
    source = make_source(api, paginator={"type": "page_number", "page_size": 10})
    result = source.fetch(cursor=None, validators={api.url("/items?page=1"): Validator('"x"')})
    assert result.validators == {} and not result.not_modified
    assert "if-none-match" not in api.received[0].headers


def _httpx_key(url: str, params: dict[str, Any], secret: tuple[str, ...] = ()) -> str:
    # request_key as it was before plain URLs skipped httpx.
    parsed = httpx.URL(url)
    if params:
        parsed = parsed.copy_merge_params(params)
    for name in secret:
        parsed = parsed.copy_remove_param(name)
    return str(parsed.copy_with(userinfo=b""))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/issues?page=2&per_page=100&state=all",
        "https://api.github.com/repositories/1/issues?since=2026-01-01T00%3A00%3A00Z&page=3",
        "https://api.example.com/v1/items?cursor=a%2Fb&x=&y",
        "https://api.example.com/items?q=a+b&filter=(x,y)",
        # Not plain: each is one httpx would rewrite, so the key goes through httpx.
        "https://API.example.com/items?page=2",
        "http://example.com:80/items?page=2",
        "https://example.com:443/items",
        "https://user:pw@example.com/items?page=2",
        "https://example.com/a/../items?page=2",
        "https://example.com/items?q=a b",
        "https://example.com/items?q=%zz",
        "https://example.com/items#page2",
    ],
)
def test_validator_key_is_httpx_canonical_url(url):
    # Plain next links skip httpx's URL parsing; the key must be the one httpx would give,
    # or stored validators would stop matching.
    assert request_key(PageRequest(url, {})) == _httpx_key(url, {})
    assert request_key(PageRequest(url, {"per_page": 50})) == _httpx_key(url, {"per_page": 50})
    with_secret = str(httpx.URL(url).copy_merge_params({"key": "s3"}))
    assert request_key(PageRequest(with_secret, {}), ["key"]) == _httpx_key(
        with_secret, {}, ("key",)
    )
