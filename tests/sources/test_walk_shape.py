"""A snapshot sync whose pages all answer 304 still sees deletes when the walk got shorter:
a last page that vanished, or a parent whose child walk is gone (json-server's behaviour,
served by our own loopback server)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from apiserver import ApiServer, Received, Reply
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import SyncStats, run_sync


def json_server(api: ApiServer, path: str, items: list[dict[str, Any]]) -> None:
    """Serve ``items`` at ``path`` like json-server: ``_page``/``_limit``, Link, weak ETag of
    the body, 304 (Link repeated) when If-None-Match matches."""

    def handler(request: Received) -> Reply:
        limit = int(request.query.get("_limit", 10))
        page = int(request.query.get("_page", 1))
        body = json.dumps(items[(page - 1) * limit : page * limit]).encode()
        etag = f'W/"{hashlib.sha1(body).hexdigest()[:16]}"'
        last = max(1, -(-len(items) // limit))
        links = [f'<{api.url(path)}?_page=1&_limit={limit}>; rel="first"']
        if page < last:
            links.append(f'<{api.url(path)}?_page={page + 1}&_limit={limit}>; rel="next"')
        links.append(f'<{api.url(path)}?_page={last}&_limit={limit}>; rel="last"')
        headers = {"ETag": etag, "Link": ", ".join(links), "X-Total-Count": str(len(items))}
        if request.headers.get("if-none-match") == etag:
            return Reply(304, b"", headers)
        return Reply(200, body, {"Content-Type": "application/json", **headers})

    api.route(path, handler)


@pytest.fixture
def api() -> Any:
    with ApiServer() as server:
        yield server


def sync(url: str, config: RestSourceConfig) -> SyncStats:
    with connect(url) as wh:
        return run_sync(wh, RestSource(config))


def test_a_deleted_last_page_behind_a_304_is_a_delete(warehouse_url: str, api: ApiServer) -> None:
    items = [{"id": i, "title": f"item {i}"} for i in range(1, 52)]
    json_server(api, "/items", items)
    config = RestSourceConfig.model_validate(
        {
            "name": "items",
            "type": "rest",
            "table": "items",
            "base_url": api.base_url,
            "path": "/items",
            "params": {"_page": 1, "_limit": 50},
            "paginator": {"type": "link_header"},
            "primary_key": "id",
            "columns": {"id": "bigint", "title": "text"},
        }
    )
    assert (sync(warehouse_url, config).inserted, api.received[-1].query["_page"]) == (51, "2")
    unchanged = sync(warehouse_url, config)
    assert (unchanged.not_modified, unchanged.requests) == (True, 2)
    del items[50]  # the only item of page 2: page 1 is the same body, without a next link
    stats = sync(warehouse_url, config)
    assert (stats.not_modified, stats.deleted, stats.row_count) == (False, 1, 50)
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT kind, object_key FROM items_changes WHERE kind = 'delete'") == [
            ("delete", "51")
        ]
    # The shorter walk is the stored one now: all 304 again, nothing changed.
    again = sync(warehouse_url, config)
    assert (again.not_modified, again.changed, again.requests) == (True, 0, 1)


def test_a_deleted_parent_behind_304_children_deletes_its_children(
    warehouse_url: str, api: ApiServer
) -> None:
    posts = [{"id": p} for p in (1, 2, 3)]
    comments = {p: [{"id": p * 10 + c, "body": f"c{c}"} for c in range(3)] for p in (1, 2, 3)}
    api.route("/posts", lambda request: Reply.json(posts))
    for p, listed in comments.items():
        json_server(api, f"/posts/{p}/comments", listed)
    config = RestSourceConfig.model_validate(
        {
            "name": "comments",
            "type": "rest",
            "table": "comments",
            "base_url": api.base_url,
            "path": "/posts/{parent.id}/comments",
            "paginator": {"type": "link_header"},
            "parent": {"path": "/posts", "fields": {"post_id": "id"}},
            "primary_key": ["post_id", "id"],
            "columns": {"post_id": "bigint", "id": "bigint", "body": "text"},
        }
    )
    assert sync(warehouse_url, config).inserted == 9
    assert sync(warehouse_url, config).not_modified is True
    del posts[1]  # post 2 and its comments are gone; posts 1 and 3 answer 304
    stats = sync(warehouse_url, config)
    assert (stats.not_modified, stats.deleted, stats.row_count) == (False, 3, 6)
    with connect(warehouse_url) as wh:
        deleted = wh.fetch("SELECT old_post_id FROM comments_changes WHERE kind = 'delete'")
    assert deleted == [(2,), (2,), (2,)]
    assert sync(warehouse_url, config).not_modified is True
