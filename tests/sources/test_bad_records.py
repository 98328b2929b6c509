"""on_bad_record: a record that cannot be stored fails the sync by name, or (skip) is left out,
recorded in rejected_records and asked for again, on both backends."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import ApiServer, Received, Reply
from changewatch.sources.errors import PayloadError
from changewatch.sources.rest import RestSource, build_rest_source
from changewatch.warehouse import connect
from changewatch.warehouse.rejections import count_rejected
from changewatch.warehouse.sync import run_sync

GOOD = {"id": 1, "title": "fine", "score": 5, "updated_at": "2026-01-01T00:00:00Z"}


class Items:
    """``/items``: the records of ``self.records``; remembers each request's query."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.queries: list[dict[str, str]] = []

    def __call__(self, request: Received) -> Reply:
        self.queries.append(dict(request.query))
        return Reply.json(self.records, ETag='"v1"')


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


def source(api: ApiServer, **settings: Any) -> RestSource:
    return build_rest_source(
        {
            "name": "acme_items",
            "type": "rest",
            "table": "items",
            "primary_key": "id",
            "updated_at": "updated_at",
            "columns": {
                "id": "bigint",
                "title": "text",
                "score": "bigint",
                "updated_at": "timestamp",
            },
            "base_url": api.base_url,
            "path": "items",
            "max_value_bytes": 4096,
            **settings,
        }
    )


def bad_records() -> list[dict[str, Any]]:
    """A good record and one of each kind that cannot be stored."""
    return [
        GOOD,
        {"id": 2, "title": "x" * 5000, "score": 1, "updated_at": "2026-01-02T00:00:00Z"},
        {"id": 3, "title": "t", "score": "many", "updated_at": "2026-01-03T00:00:00Z"},
        {"title": "no key", "score": 2, "updated_at": "2026-01-04T00:00:00Z"},
    ]


def rejected(wh: Any) -> list[tuple[str, str, str]]:
    return wh.fetch(
        "SELECT record_key, field, reason FROM rejected_records WHERE source = 'acme_items' "
        "ORDER BY record_key, field"
    )


def test_skip_stores_the_rest_records_each_rejection_and_takes_it_when_it_fits(
    warehouse_url: str, api: ApiServer
) -> None:
    items = Items(bad_records())
    api.route("/items", items)
    skip = source(api, on_bad_record="skip")
    with connect(warehouse_url) as wh:
        first = run_sync(wh, skip)
        assert (first.status, first.inserted, first.rejected) == ("succeeded", 1, 3)
        assert wh.fetch("SELECT id, title FROM items") == [(1, "fine")]
        assert rejected(wh) == [
            ("document 1 record #3", "id", "no primary key ['id']"),
            ('{"id": 2}', "title", "value is 4.883 KiB, over max_value_bytes (4 KiB)"),
            ('{"id": 3}', "score", "value 'many' is not a bigint"),
        ]
        assert count_rejected(wh, "acme_items") == (3, "document 1 record #3")
        # The cursor stays, so an incremental walk would ask for the rejected records again.
        assert first.cursor_after is None
        again = run_sync(wh, skip)  # the same answer: the same rows, nothing new stored
        assert (again.inserted, again.unchanged, again.rejected) == (0, 1, 3)
        assert len(rejected(wh)) == 3
        # Upstream fixes two of them: they are stored, and their rejected rows are gone.
        items.records[1]["title"] = "short now"
        items.records[2]["score"] = 7
        fixed = run_sync(wh, skip)
        assert (fixed.inserted, fixed.rejected) == (2, 1)
        assert wh.fetch("SELECT id, score FROM items ORDER BY id") == [(1, 5), (2, 1), (3, 7)]
        assert [key for key, _, _ in rejected(wh)] == ["document 1 record #3"]
        assert fixed.cursor_after is None  # one record is still rejected
        items.records.pop()
        clean = run_sync(wh, skip)
        assert (clean.rejected, rejected(wh)) == (0, [])
        assert clean.cursor_after == "2026-01-03T00:00:00Z"


def test_skip_never_deletes_a_stored_row_whose_new_version_is_rejected(
    warehouse_url: str, api: ApiServer
) -> None:
    items = Items([GOOD, {**GOOD, "id": 2}])
    api.route("/items", items)
    skip = source(api, on_bad_record="skip")
    with connect(warehouse_url) as wh:
        assert run_sync(wh, skip).inserted == 2
        items.records[1] = {**GOOD, "id": 2, "score": 1.5}
        second = run_sync(wh, skip)
        assert (second.deleted, second.updated, second.rejected) == (0, 0, 1)
        assert wh.fetch("SELECT id, score FROM items ORDER BY id") == [(1, 5), (2, 5)]


def test_skip_holds_an_incremental_cursor_and_its_validators(
    warehouse_url: str, api: ApiServer
) -> None:
    items = Items([GOOD, {**GOOD, "id": 3, "score": "many", "updated_at": "2026-02-01T00:00:00Z"}])
    api.route("/items", items)
    skip = source(api, on_bad_record="skip", sync="incremental", incremental={"param": "since"})
    with connect(warehouse_url) as wh:
        stats = run_sync(wh, skip)
        assert (stats.inserted, stats.rejected, stats.cursor_after) == (1, 1, None)
        assert wh.fetch("SELECT count(*) FROM http_validators") == [(0,)]
        run_sync(wh, skip)
        assert "since" not in items.queries[-1]  # asked for everything again, unconditionally
        items.records[1]["score"] = 9
        assert run_sync(wh, skip).inserted == 1
        assert wh.fetch("SELECT count(*) FROM http_validators") == [(1,)]
        run_sync(wh, skip)
        assert items.queries[-1]["since"] == "2026-02-01T00:00:00Z"


def test_fail_names_the_source_and_the_record_and_stores_nothing(
    warehouse_url: str, api: ApiServer
) -> None:
    api.route("/items", Items([GOOD, {**GOOD, "id": 3, "score": "many"}]))
    with connect(warehouse_url) as wh:
        with pytest.raises(PayloadError) as failed:
            run_sync(wh, source(api))
        assert str(failed.value).startswith(
            "source 'acme_items': document 1 record #1 (key {'id': 3}): field 'score' value "
            "'many' is not a bigint"
        )
        assert wh.fetch("SELECT count(*) FROM items") == [(0,)]
        assert rejected(wh) == []


def test_rejected_records_are_visible_to_changewatch_sql(tmp_path: Path, api: ApiServer) -> None:
    url = f"duckdb:///{tmp_path / 'w.duckdb'}"
    api.route("/items", Items(bad_records()))
    with connect(url) as wh:
        run_sync(wh, source(api, on_bad_record="skip"))
    done = subprocess.run(
        [sys.executable, "-m", "changewatch.pipeline.cli", "sql",
         "SELECT record_key, field FROM rejected_records ORDER BY 1"],
        env={"PATH": "/usr/bin:/bin", "CHANGEWATCH_WAREHOUSE_URL": url},
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '{"id": 2}' in done.stdout and "score" in done.stdout
