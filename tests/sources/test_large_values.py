"""Large values: stored exactly on both backends, refused past max_value_bytes, never stuck."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest
from apiserver import ApiServer, Received, Reply
from changewatch.sources.base import SourceBase
from changewatch.sources.errors import PayloadError
from changewatch.sources.normalize import normalize_batch
from changewatch.sources.rest import RestSource, build_rest_source
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync

# A minute or more in all, even with the 100 MB values in the end-to-end tier.
pytestmark = pytest.mark.heavy


class BigRecords:
    """``/items``: record 1 with a ``title`` of ``size`` characters of ``letter``, record 2
    small."""

    def __init__(self, size: int, letter: str = "x") -> None:
        self.size, self.letter = size, letter

    def records(self) -> list[dict[str, Any]]:
        return [{"id": 1, "title": self.letter * self.size}, {"id": 2, "title": "small"}]

    def __call__(self, request: Received) -> Reply:
        body = json.dumps(self.records()).encode()
        return Reply(200, body, {"Content-Type": "application/json"})


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


def big_source(api: ApiServer, **settings: Any) -> RestSource:
    config = {
        "name": "acme_items",
        "type": "rest",
        "table": "items",
        "primary_key": "id",
        "columns": {"id": "bigint", "title": "text"},
        "base_url": api.base_url,
        "path": "items",
        # The response cap (64 MiB by default) is another limit than the value's.
        "max_response_bytes": "256MiB",
        **settings,
    }
    return build_rest_source(config)


def stored_title(wh: Any, key: int) -> str:
    return wh.fetch("SELECT title FROM items WHERE id = $1", (key,))[0][0]


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(20_000_000, id="20MB"),
        # A stress size (12-24 s and a GiB or more per backend): the end-to-end tier's.
        pytest.param(100_000_000, id="100MB", marks=pytest.mark.e2e),
    ],
)
def test_a_large_value_is_stored_exactly_and_its_change_too(
    warehouse_url: str, api: ApiServer, size: int
) -> None:
    # Before, the stage's 160 MB ran out parsing a 20 MB value (and the DuckDB warehouse's
    # 128 MB writing a 100 MB one), and every later sync failed the same way.
    payload = BigRecords(size)
    api.route("/items", payload)
    source = big_source(api, max_value_bytes="128MiB")
    with connect(warehouse_url) as wh:
        first = run_sync(wh, source)
        assert (first.inserted, first.updated) == (2, 0)
        assert stored_title(wh, 1) == "x" * size
        payload.letter = "y"
        second = run_sync(wh, source)
        assert (second.inserted, second.updated, second.unchanged) == (0, 1, 1)
        assert stored_title(wh, 1) == "y" * size
        changed = wh.fetch(
            "SELECT length(old_title), length(new_title) FROM items_changes "
            "WHERE sync_id = $1 AND kind = 'update'",
            (second.sync_id,),
        )
        assert changed == [(size, size)]


def test_the_largest_value_under_the_default_limit_is_stored_in_a_json_column(
    warehouse_url: str, api: ApiServer
) -> None:
    # Issue 30: a 24.5 MiB value under the default limit (then 64 MiB) ran out of memory in the
    # stage (24x the document was not enough for a json column) and in a DuckDB warehouse (6x),
    # on every sync. Now the default is 32 MiB and the rooms are as measured (see staged.py).
    size = (32 << 20) - 64
    blob = {"letter": "x"}
    body = lambda request: Reply.json([{"id": 1, "meta": {"blob": blob["letter"] * size}}])  # noqa: E731
    api.route("/items", body)
    source = big_source(api, columns={"id": "bigint", "meta": "json"}, max_response_bytes="64MiB")
    assert source.config.max_value_bytes == 32 << 20  # the default
    with connect(warehouse_url) as wh:
        assert run_sync(wh, source).inserted == 1
        blob["letter"] = "y"
        assert run_sync(wh, source).updated == 1
        assert run_sync(wh, source).unchanged == 1
        stored = wh.fetch("SELECT CAST(meta AS TEXT) FROM items")[0][0]
        assert json.loads(stored) == {"blob": "y" * size}


def test_a_value_over_max_value_bytes_is_refused_by_name_and_the_source_is_not_stuck(
    warehouse_url: str, api: ApiServer
) -> None:
    api.route("/items", BigRecords(3 << 20))
    with connect(warehouse_url) as wh:
        with pytest.raises(PayloadError) as refused:
            run_sync(wh, big_source(api, max_value_bytes="1MiB"))
        assert str(refused.value) == (
            "source 'acme_items': record {'id': 1}: field 'title' is 3 MiB, over "
            "max_value_bytes (1 MiB); raise it in watches.yaml"
        )
        # Nothing of the refused sync is stored; its run is recorded as failed, by name.
        assert wh.fetch("SELECT count(*) FROM items") == [(0,)]
        runs = wh.fetch("SELECT status, error FROM sync_runs WHERE source = 'acme_items'")
        assert [status for status, _ in runs] == ["failed"]
        assert "field 'title' is 3 MiB" in runs[0][1]
        # With the limit raised, the next sync stores the value.
        stats = run_sync(wh, big_source(api, max_value_bytes=4 << 20))
        assert stats.inserted == 2
        assert stored_title(wh, 1) == "x" * (3 << 20)


def test_a_nested_value_over_the_limit_is_named_by_its_path(
    warehouse_url: str, api: ApiServer
) -> None:
    body = [{"id": 7, "title": "t", "meta": {"blobs": ["small", "z" * 5000]}}]
    api.route("/items", lambda request: Reply.json(body))
    with connect(warehouse_url) as wh, pytest.raises(PayloadError) as refused:
        run_sync(wh, big_source(api, max_value_bytes=4096))
    assert str(refused.value).startswith(
        "source 'acme_items': record {'id': 7}: field 'meta.blobs[1]' is 4.883 KiB, over "
        "max_value_bytes (4 KiB)"
    )


def test_running_out_of_memory_is_named_as_such_not_as_a_bad_record() -> None:
    # Before, it read "records do not fit the declared columns: Out of Memory Error ...".
    config = SourceBase(
        name="acme_items",
        type="rest",
        table="items",
        primary_key="id",
        columns={"id": "bigint", "title": "text"},
    )
    big = json.dumps([{"id": 1, "title": "x" * 8_000_000}]).encode()
    with duckdb.connect(config={"memory_limit": "30MB", "threads": 1}) as con:
        with pytest.raises(PayloadError) as refused:
            normalize_batch([b'[{"id": 0}]', big], None, config, connection=con, first_document=4)
    message = str(refused.value)
    assert message.startswith(
        "source 'acme_items': out of memory normalizing documents 5-6 (the largest is 7.629 MiB): "
        "Out of Memory Error: "
    )
    assert message.endswith("; lower the source's max_value_bytes (32 MiB) to refuse such values")
