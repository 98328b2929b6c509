"""The declarative REST features on a scripted loopback server: parent -> child walks,
response actions, the incremental lag, and listings that shift while they are paged."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from apiserver import ApiServer, Received, Reply
from changewatch.sources.errors import FetchError, PayloadError
from changewatch.sources.http import HttpClient, HttpPolicy
from changewatch.sources.rest import RestSource, RestSourceConfig, build_rest_source
from changewatch.sources.rest.config import Incremental
from changewatch.sources.rest.source import cursor_param
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from pydantic import ValidationError


@pytest.fixture
def api():
    with ApiServer() as server:
        yield server


def make_source(api: ApiServer, **settings: Any) -> RestSource:
    config = {
        "name": "acme",
        "type": "rest",
        "table": "acme",
        "primary_key": "id",
        "columns": {"id": "bigint", "title": "text", "updated_at": "timestamp"},
        "base_url": api.base_url,
        "path": "items",
        **settings,
    }
    factory = functools.partial(HttpClient, sleep=lambda seconds: None)
    return build_rest_source(config, policy=HttpPolicy(max_retries=1), client_factory=factory)


def child_source(api: ApiServer, **settings: Any) -> RestSource:
    """Comments of every post: ``/posts`` (2 per page) -> ``/posts/{id}/comments``."""
    columns = {"post_id": "bigint", "id": "bigint", "text": "text", "author": "text"}
    parent = {
        "path": "/posts",
        "records_path": "data",
        "paginator": {"type": "page_number", "page_size": 2},
        "fields": {"post_id": "id", "author": "user.name"},
        **settings.pop("parent", {}),
    }
    return make_source(
        api,
        path="/posts/{parent.id}/comments",
        parent=parent,
        primary_key=["post_id", "id"],
        columns=columns,
        **settings,
    )


def serve_posts(api: ApiServer, posts: list[dict[str, Any]]) -> None:
    def listing(request: Received) -> Reply:
        page = int(request.query["page"])
        return Reply.json({"data": posts[(page - 1) * 2 : page * 2]})

    api.route("/posts", listing)
    for post in posts:
        comments = [{"id": n, "text": f"c{n} of {post['id']}"} for n in range(post["id"] % 3)]
        api.route(f"/posts/{post['id']}/comments", functools.partial(_reply, comments))


def _reply(data: Any, request: Received) -> Reply:
    return Reply.json(data)


def posts(*keys: int) -> list[dict[str, Any]]:
    return [{"id": key, "user": {"name": f"u{key}"}} for key in keys]


# --- parent -> child ----------------------------------------------------------------------------


def test_one_child_walk_per_parent_record_with_parent_fields_copied(api):
    serve_posts(api, posts(1, 2, 4, 5))
    result = child_source(api).fetch(cursor=None)
    assert api.paths() == [
        "/posts",
        "/posts",
        "/posts",  # page 3 is empty: the parent listing ends
        "/posts/1/comments",
        "/posts/2/comments",
        "/posts/4/comments",
        "/posts/5/comments",
    ]
    assert result.records() == [
        {"id": 0, "text": "c0 of 1", "post_id": 1, "author": "u1"},
        {"id": 0, "text": "c0 of 2", "post_id": 2, "author": "u2"},
        {"id": 1, "text": "c1 of 2", "post_id": 2, "author": "u2"},
        {"id": 0, "text": "c0 of 4", "post_id": 4, "author": "u4"},
        {"id": 0, "text": "c0 of 5", "post_id": 5, "author": "u5"},
        {"id": 1, "text": "c1 of 5", "post_id": 5, "author": "u5"},
    ]
    assert result.complete and result.record_count == 6 and result.pages == 7


def test_child_walks_are_paginated_and_placeholders_fill_params(api):
    api.route("/posts", lambda request: Reply.json([{"id": 7, "slug": "a b/c"}]))

    def comments(request: Received) -> Reply:
        offset = int(request.query["offset"])
        return Reply.json([{"id": i} for i in range(5)][offset : offset + 2])

    api.route("/posts/a b/c/comments", comments)  # never: the slash is escaped
    api.route("/posts/a%20b%2Fc/comments", comments)
    source = make_source(
        api,
        path="/posts/{parent.slug}/comments",
        params={"post": "{parent.id}", "fixed": 1},
        paginator={"type": "offset", "limit": 2},
        parent={"path": "/posts", "fields": {"post_id": "id"}},
        primary_key=["post_id", "id"],
        columns={"post_id": "bigint", "id": "bigint"},
    )
    result = source.fetch(cursor=None)
    assert [(r["post_id"], r["id"]) for r in result.records()] == [(7, i) for i in range(5)]
    walks = [r for r in api.received if r.path != "/posts"]
    assert [r.query["offset"] for r in walks] == ["0", "2", "4"]
    assert all(r.query["post"] == "7" and r.query["fixed"] == "1" for r in walks)


def test_a_parent_listed_twice_is_walked_once(api):
    api.route("/posts", lambda request: Reply.json({"data": posts(1, 1, 2)}))
    api.route("/posts/1/comments", lambda request: Reply.json([{"id": 1}]))
    api.route("/posts/2/comments", lambda request: Reply.json([{"id": 1}]))
    child_source(api, parent={"paginator": {"type": "none"}}).fetch(cursor=None)
    assert api.paths() == ["/posts", "/posts/1/comments", "/posts/2/comments"]


def test_a_parent_record_without_the_placeholder_field_fails(api):
    api.route("/posts", lambda request: Reply.json({"data": [{"user": {"name": "x"}}]}))
    source = child_source(api, parent={"paginator": {"type": "none"}})
    with pytest.raises(PayloadError, match="acme.*parent record has no 'id'"):
        source.fetch(cursor=None)


def test_a_child_sync_keys_rows_on_parent_and_child_ids(api, tmp_path):
    serve_posts(api, posts(1, 2, 5))
    with connect(f"duckdb:///{tmp_path / 'wh.duckdb'}") as wh:
        stats = run_sync(wh, child_source(api))
        assert stats.inserted == 5
        rows = wh.fetch_frame("SELECT post_id, id, author FROM acme ORDER BY post_id, id")
        assert rows.rows() == [(1, 0, "u1"), (2, 0, "u2"), (2, 1, "u2"), (5, 0, "u5"), (5, 1, "u5")]


# --- response actions ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [404, 410])
def test_an_ignored_status_skips_that_child_walk(api, status):
    serve_posts(api, posts(1, 2, 5))
    api.queue("/posts/2/comments", Reply.json({"message": "gone"}, status=status))
    actions = [{"status": 404, "action": "ignore"}, {"status": 410, "action": "ignore"}]
    result = child_source(api, response_actions=actions).fetch(cursor=None)
    assert sorted({r["post_id"] for r in result.records()}) == [1, 5]
    assert result.complete and result.notes == {"ignored": {status: 1}}


def test_a_204_can_be_ignored(api):
    serve_posts(api, posts(1, 2))
    api.queue("/posts/1/comments", Reply(204))
    actions = [{"status": 204, "action": "ignore"}]
    result = child_source(api, response_actions=actions).fetch(cursor=None)
    assert [r["post_id"] for r in result.records()] == [2, 2]


def test_without_an_action_the_error_fails_the_fetch(api):
    serve_posts(api, posts(1, 2))
    api.queue("/posts/2/comments", Reply.json({}, status=404))
    actions = [{"status": 410, "action": "ignore"}]
    with pytest.raises(FetchError, match="404"):
        child_source(api, response_actions=actions).fetch(cursor=None)


def test_the_parent_listing_never_ignores_errors(api):
    api.queue("/posts", Reply.json({}, status=404))
    actions = [{"status": 404, "action": "ignore"}]
    with pytest.raises(FetchError, match="404"):
        child_source(api, response_actions=actions).fetch(cursor=None)


# --- incremental lag ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cursor", "settings", "sent"),
    [
        ("2024-05-01T12:00:00Z", {"lag": "5m"}, "2024-05-01T11:55:00Z"),
        ("2024-05-01T12:00:00.250000+00:00", {"lag": 90}, "2024-05-01T11:58:30.250000Z"),
        ("2024-05-01T00:02:00+02:00", {"lag": "1h"}, "2024-04-30T21:02:00Z"),
        ("2024-05-01T12:00:00Z", {"lag": "5m", "format": "unix"}, 1714564500),
        ("2024-05-01T12:00:00+00:00", {}, "2024-05-01T12:00:00+00:00"),  # no lag: as stored
    ],
)
def test_lag_is_subtracted_from_the_cursor(cursor, settings, sent):
    assert cursor_param(cursor, Incremental(**settings)) == sent


def test_late_rows_within_the_lag_are_fetched_and_refetched_rows_are_no_change(api, warehouse_url):
    rows = [
        {"id": 1, "title": "a", "updated_at": "2024-05-01T11:50:00Z"},
        {"id": 2, "title": "b", "updated_at": "2024-05-01T12:00:00Z"},
    ]

    def since(request: Received) -> Reply:
        after = request.query.get("since", "")
        return Reply.json([r for r in rows if r["updated_at"] >= after])

    api.route("/items", since)
    settings = {"sync": "incremental", "updated_at": "updated_at"}
    source = make_source(api, incremental={"param": "since", "lag": "5m"}, **settings)
    with connect(warehouse_url) as wh:
        assert run_sync(wh, source).inserted == 2
        # Committed upstream after that sync, but stamped before its cursor (12:00).
        rows.append({"id": 3, "title": "late", "updated_at": "2024-05-01T11:58:00Z"})
        second = run_sync(wh, source)
        assert api.received[-1].query["since"] == "2024-05-01T11:55:00Z"
        assert (second.inserted, second.updated, second.unchanged) == (1, 0, 1)
        assert second.cursor_after == "2024-05-01T12:00:00Z"


# --- listings that shift while they are paged ---------------------------------------------------


def shrinking(api: ApiServer, total: int, delete_after_first: int) -> list[dict[str, Any]]:
    """``/items?offset&limit`` over ids 0..total-1; after the first page, the first
    ``delete_after_first`` rows are deleted (every later page has shifted up)."""
    data = [{"id": i, "title": f"item {i}"} for i in range(total)]

    def handler(request: Received) -> Reply:
        offset, limit = int(request.query["offset"]), int(request.query["limit"])
        page = data[offset : offset + limit]
        if len(api.received) == 1:
            del data[:delete_after_first]
        return Reply.json(page)

    api.route("/items", handler)
    return data


def fetched_ids(result) -> set[int]:
    return {record["id"] for record in result.records()}


def test_without_overlap_a_delete_ahead_of_the_walk_loses_a_row(api):
    remaining = shrinking(api, total=12, delete_after_first=1)
    result = make_source(api, paginator={"type": "offset", "limit": 4}).fetch(cursor=None)
    assert {r["id"] for r in remaining} - fetched_ids(result) == {4}  # silently lost


@pytest.mark.parametrize("deleted", [1, 2, 5])
def test_overlap_keeps_every_row_when_the_listing_shifts(api, deleted):
    # 1 row: the overlap covers it. 2 (= overlap) and 5 rows: the next page holds none of
    # the overlap rows, so the walk steps back until it finds them.
    remaining = shrinking(api, total=12, delete_after_first=deleted)
    paginator = {"type": "offset", "limit": 4, "overlap": 2}
    result = make_source(api, paginator=paginator).fetch(cursor=None)
    assert {r["id"] for r in remaining} <= fetched_ids(result)
    offsets = [int(r.query["offset"]) for r in api.received]
    assert offsets[:2] == [0, 2]
    if deleted > 1:
        assert offsets[2] < offsets[1]  # stepped back


def test_overlap_dedupes_parents_of_a_shifting_parent_listing(api):
    data = posts(1, 2, 3, 4, 5, 6)

    def listing(request: Received) -> Reply:
        offset, limit = int(request.query["offset"]), int(request.query["limit"])
        page = data[offset : offset + limit]
        if offset == 0:
            data.insert(0, {"id": 0, "user": {"name": "new"}})  # shifts the rest down
        return Reply.json({"data": page})

    api.route("/posts", listing)
    for key in range(7):
        api.route(f"/posts/{key}/comments", lambda request: Reply.json([{"id": 1}]))
    paginator = {"type": "offset", "limit": 3, "overlap": 1}
    result = child_source(api, parent={"paginator": paginator}).fetch(cursor=None)
    walked = [p for p in api.paths() if p != "/posts"]
    assert walked == [f"/posts/{key}/comments" for key in (1, 2, 3, 4, 5, 6)]
    assert [r["post_id"] for r in result.records()] == [1, 2, 3, 4, 5, 6]


# --- config -------------------------------------------------------------------------------------

BASE = {
    "name": "acme",
    "type": "rest",
    "table": "acme",
    "primary_key": "id",
    "columns": {"id": "bigint"},
    "base_url": "https://api.example.com",
}


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"response_actions": [{"status": 404, "action": "retry"}]}, "'ignore'"),
        ({"response_actions": [{"status": 404}]}, "action"),
        ({"response_actions": [{"status": 503, "action": "ignore"}]}, "cannot take an action"),
        ({"response_actions": [{"status": 429, "action": "ignore"}]}, "cannot take an action"),
        ({"path": "/posts/{parent.id}/comments"}, "need a parent"),
        ({"params": {"post": "{parent.id}"}}, "need a parent"),
        ({"path": "/comments", "parent": {"path": "/posts"}}, "needs {parent.<field>}"),
        ({"path": "/p/{parent.}/c", "parent": {"path": "/p"}}, "needs {parent"),
        ({"path": "/p/{parent.id}/{parent}", "parent": {"path": "/p"}}, "malformed"),
        ({"path": "/p/{parent.id}", "parent": {"path": "/p", "fields": {"Bad": "id"}}}, "Bad"),
        ({"paginator": {"type": "offset", "limit": 5, "overlap": 5}}, "smaller than"),
        ({"incremental": {"lag": "soon"}}, "not a duration"),
        ({"incremental": {"lag": -5}}, "greater than or equal"),
    ],
)
def test_config_rejects(settings, problem):
    with pytest.raises(ValidationError, match=problem):
        RestSourceConfig.model_validate({**BASE, **settings})


def test_config_accepts_the_declarative_settings():
    config = RestSourceConfig.model_validate(
        {
            **BASE,
            "path": "/posts/{parent.id}/comments",
            "parent": {"path": "/posts", "fields": {"post_id": "id"}},
            "response_actions": [{"status": 404, "action": "ignore"}],
            "incremental": {"param": "since", "lag": "5m"},
        }
    )
    assert config.parent is not None and config.parent.paginator.type == "none"
    assert config.incremental is not None and config.incremental.lag == 300.0
