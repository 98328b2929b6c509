"""The declarative REST source against a real json-server 0.17, configured purely in YAML.

``npm ci`` installs json-server into ``tests/jsonserver/node_modules`` on the first run (and
fails the tests, never skips them, when it cannot). Each test starts its own json-server on
a free loopback port over a fresh ``db.json`` (``tests/jsonserver/make_db.py``: 250 items,
250 comments), so the changes one test makes through json-server's REST API never leak into
the next (the DuckDB and the Postgres run of a test each get pristine data).
"""

from __future__ import annotations

import runpy
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from changewatch.pipeline.project.watches_file import load_config
from changewatch.sources import build_source
from changewatch.sources.rest import RestSource
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync
from cw_testing import REPO

PACKAGE = REPO / "tests" / "jsonserver"
BINARY = PACKAGE / "node_modules" / ".bin" / "json-server"
make_db: dict[str, Any] = runpy.run_path(str(PACKAGE / "make_db.py"))


@pytest.fixture(scope="session")
def json_server_bin() -> Path:
    """The json-server executable, installed from the committed lock file when missing."""
    if not BINARY.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is not installed: it is needed to install json-server for tests")
        done = subprocess.run(
            [npm, "ci", "--prefix", str(PACKAGE), "--no-audit", "--no-fund"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0 or not BINARY.exists():
            pytest.fail(f"npm ci --prefix {PACKAGE} failed:\n{done.stdout}\n{done.stderr}")
    return BINARY


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class JsonServer:
    """A running json-server: its URL, the data it started with, and its REST API."""

    def __init__(self, url: str, data: dict[str, Any]) -> None:
        self.url = url
        self.data = data
        self.api = httpx.Client(base_url=url, timeout=10)

    def patch(self, collection: str, key: int, **fields: Any) -> None:
        self.api.patch(f"/{collection}/{key}", json=fields).raise_for_status()

    def delete(self, collection: str, key: int) -> None:
        self.api.delete(f"/{collection}/{key}").raise_for_status()


@pytest.fixture
def json_server(json_server_bin: Path, tmp_path: Path) -> Iterator[JsonServer]:
    """json-server over a fresh ``db.json`` on a free port; stopped after the test."""
    db = tmp_path / "db.json"
    data = make_db["write"](db)
    port = _free_port()
    log = (tmp_path / "json-server.log").open("w")
    process = subprocess.Popen(
        [str(json_server_bin), "--port", str(port), "--host", "127.0.0.1", str(db)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = JsonServer(f"http://127.0.0.1:{port}", data)
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                pytest.fail(f"json-server exited with {process.returncode}: see {log.name}")
            try:
                if server.api.get("/items", params={"_limit": 1}).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"json-server did not answer on port {port} within 20 s")
            time.sleep(0.05)
        yield server
    finally:
        server.api.close()
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


SOURCES_YAML = """\
version: 1
sources:
  - name: js_items
    type: rest
    table: js_items
    base_url: {url}
    path: /items
    # json-server 0.17: sort, then page with _page/_limit; updatedAt_gte compares strings.
    params: {{_sort: updatedAt, _order: asc}}
    paginator: {{type: page_number, page_param: _page, page_size_param: _limit, page_size: 100}}
    sync: incremental
    incremental: {{param: updatedAt_gte, format: iso, lag: 2m}}
    primary_key: id
    updated_at: updated_at
    columns:
      id: bigint
      title: text
      status: text
      tags: text[]
      updated_at: {{type: timestamp, path: updatedAt}}

  - name: js_items_offset
    type: rest
    table: js_items_offset
    base_url: {url}
    path: /items
    params: {{_sort: id, _order: asc}}
    paginator: {{type: offset, offset_param: _start, limit_param: _limit, limit: 60, overlap: 3}}
    primary_key: id
    columns:
      id: bigint
      title: text

  - name: js_pages
    type: rest
    table: js_pages
    base_url: {url}
    path: /items
    # json-server answers _page with a Link header, and a matching If-None-Match with a 304.
    params: {{_page: 1, _limit: 249}}
    paginator: {{type: link_header}}
    primary_key: id
    columns:
      id: bigint
      title: text

  - name: js_comments
    type: rest
    table: js_comments
    base_url: {url}
    # json-server's nested route: /items/1/comments lists the comments with itemId 1.
    path: /items/{{parent.id}}/comments
    parent:
      path: /items
      paginator: {{type: page_number, page_param: _page, page_size_param: _limit, page_size: 100}}
      fields: {{item_id: id}}
    response_actions:
      - {{status: 404, action: ignore}}
    primary_key: [item_id, id]
    columns:
      item_id: bigint
      id: bigint
      body: text
      updated_at: {{type: timestamp, path: updatedAt}}
"""


def sources_from_yaml(server: JsonServer, tmp_path: Path) -> dict[str, RestSource]:
    """The YAML above, loaded like any watches file and built into connectors."""
    file = tmp_path / "watches.yaml"
    file.write_text(SOURCES_YAML.format(url=server.url), encoding="utf-8")
    built = {config.name: build_source(config) for config in load_config(file).sources}
    assert all(isinstance(source, RestSource) for source in built.values())
    return built  # type: ignore[return-value]


def counts(stats: Any) -> tuple[int, int, int]:
    return stats.inserted, stats.updated, stats.deleted


def test_incremental_syncs_and_a_full_sweep(
    json_server: JsonServer, tmp_path: Path, warehouse_url: str
) -> None:
    items = sources_from_yaml(json_server, tmp_path)["js_items"]
    with connect(warehouse_url) as wh:
        first = run_sync(wh, items)
        assert counts(first) == (250, 0, 0)
        assert first.pages == 3 and first.rows_fetched == 250
        assert first.cursor_after == "2024-01-01T04:10:00Z"  # item 250's updatedAt

        for key in (10, 20, 30):
            json_server.patch(
                "items", key, title=f"Item {key} v2", updatedAt="2024-02-01T00:00:00Z"
            )
        json_server.delete("items", 40)

        second = run_sync(wh, items)
        # Sent: the cursor minus the 2 minutes lag, so items 248-250 come again, unchanged.
        assert counts(second) == (0, 3, 0) and second.unchanged == 3
        assert second.rows_fetched == 6 and second.cursor_after == "2024-02-01T00:00:00Z"
        log = wh.fetch_frame("SELECT * FROM js_items_changes ORDER BY change_id")
        updates = log.filter(pl.col("kind") == "update")["object_key"].cast(int)
        assert sorted(updates) == [10, 20, 30]

        quiet = run_sync(wh, items)
        assert counts(quiet) == (0, 0, 0) and quiet.rows_fetched == 3

        sweep = run_sync(wh, items, full=True)
        assert counts(sweep) == (0, 0, 1) and sweep.rows_fetched == 249
        deletes = wh.fetch_frame("SELECT object_key FROM js_items_changes WHERE kind = 'delete'")
        assert deletes["object_key"].to_list() == ["40"]
        rows = wh.fetch_frame("SELECT id, title, tags FROM js_items WHERE id IN (10, 11)")
        item_11 = json_server.data["items"][10]
        assert rows.sort("id").rows() == [(10, "Item 10 v2", []), (11, "Item 11", item_11["tags"])]


def test_offset_walk_with_overlap(json_server: JsonServer, tmp_path: Path) -> None:
    result = sources_from_yaml(json_server, tmp_path)["js_items_offset"].fetch(cursor=None)
    ids = [record["id"] for record in result.records()]
    # Pages start 3 rows early: 0-59, 57-116, ... 228-249; each row once after dedupe.
    assert sorted(set(ids)) == list(range(1, 251))
    assert result.pages == 5 and len(ids) == 250 + 4 * 3


def test_child_resource_keyed_by_parent(
    json_server: JsonServer, tmp_path: Path, warehouse_url: str
) -> None:
    comments = sources_from_yaml(json_server, tmp_path)["js_comments"]
    with connect(warehouse_url) as wh:
        first = run_sync(wh, comments)
        assert counts(first) == (250, 0, 0)
        assert first.requests == 3 + 250  # parent pages, then one child walk per item
        stored = wh.fetch_frame("SELECT item_id, id, body FROM js_comments ORDER BY id")
        expected = sorted((c["itemId"], c["id"], c["body"]) for c in json_server.data["comments"])
        assert sorted(stored.rows()) == expected

        json_server.patch("comments", 1, body="edited")  # item 1's only comment
        json_server.delete("items", 40)  # json-server deletes its comment (id 40) too
        second = run_sync(wh, comments)
        assert counts(second) == (0, 1, 1)
        log = wh.fetch_frame("SELECT kind, object_key FROM js_comments_changes")
        changed = log.filter(pl.col("kind") != "insert").sort("kind").rows()
        assert changed == [("delete", '{"item_id":40,"id":40}'), ("update", '{"item_id":1,"id":1}')]


def test_deletes_behind_304s_are_seen(
    json_server: JsonServer, tmp_path: Path, warehouse_url: str
) -> None:
    sources = sources_from_yaml(json_server, tmp_path)
    pages, comments = sources["js_pages"], sources["js_comments"]
    with connect(warehouse_url) as wh:
        assert counts(run_sync(wh, pages)) == (250, 0, 0)
        assert counts(run_sync(wh, comments)) == (250, 0, 0)
        assert run_sync(wh, pages).not_modified and run_sync(wh, comments).not_modified

        # Item 250 was page 2's only item: page 1 is the same body (a 304), with no next link.
        # json-server deletes its comment too; the other 249 child walks answer 304.
        json_server.delete("items", 250)
        after = run_sync(wh, pages)
        assert counts(after) == (0, 0, 1) and not after.not_modified
        assert counts(run_sync(wh, comments)) == (0, 0, 1)
        deletes = wh.fetch("SELECT object_key FROM js_comments_changes WHERE kind = 'delete'")
        assert deletes == [('{"item_id":250,"id":250}',)]
        assert run_sync(wh, pages).not_modified and run_sync(wh, comments).not_modified
