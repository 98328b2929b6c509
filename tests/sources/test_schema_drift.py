"""Schema drift: a payload field that appears later is recorded, and evolves, stays raw-only,
or stops the sync, per the source's `schema` setting; no content hash moves because of it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from apiserver import ApiServer, Reply
from changewatch.sources.errors import PayloadError
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.schema import forget_tables
from changewatch.warehouse.sync import run_sync

BEFORE = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
AFTER = [{"id": 1, "name": "a", "score": 7}, {"id": 2, "name": "b", "score": 9}]


def sync(url: str, api: ApiServer, records: list[dict], mode: str) -> Any:
    api.queue("/items", Reply.json(records))
    config = RestSourceConfig.model_validate(
        {
            "name": "items",
            "type": "rest",
            "table": "items",
            "base_url": api.base_url,
            "path": "/items",
            "primary_key": "id",
            "schema": mode,
            "columns": {"id": "bigint", "name": "text"},
        }
    )
    with connect(url) as wh:
        return run_sync(wh, RestSource(config))


def fields(url: str) -> list[tuple[str, str | None, str]]:
    with connect(url) as wh:
        return sorted(wh.fetch("SELECT field, field_type, action FROM source_fields"))


@pytest.fixture
def api() -> Any:
    with ApiServer() as server:
        yield server


def test_evolve_adds_a_column_without_changing_any_row(warehouse_url: str, api: ApiServer) -> None:
    first = sync(warehouse_url, api, BEFORE, "evolve")
    assert first.drift == {}  # the first sync is the baseline schema
    second = sync(warehouse_url, api, AFTER, "evolve")
    assert second.drift == {"score": "bigint"}
    assert second.changed == 0  # the hash covers declared columns only
    with connect(warehouse_url) as wh:
        # Drifted fields become text columns: upstream may change their values' kind later.
        assert wh.fetch("SELECT id, score FROM items ORDER BY id") == [(1, "7"), (2, "9")]
    third = sync(warehouse_url, api, AFTER + [{"id": 3, "name": "c", "score": 4}], "evolve")
    assert (third.inserted, third.drift) == (1, {})
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT score FROM items WHERE id = 3") == [("4",)]
    assert ("score", "text", "evolved") in fields(warehouse_url)
    assert ("name", None, "baseline") in fields(warehouse_url)


def test_a_field_evolves_into_a_table_that_was_emptied(warehouse_url: str, api: ApiServer) -> None:
    # Every stored row is gone, so every fetched row is new, as in a first sync; but this is
    # not the baseline: the new field becomes a column, filled in the rows that arrive with it
    # (PostgreSQL loads a first sync's table on the side, which must not happen here).
    sync(warehouse_url, api, BEFORE, "evolve")
    emptied = sync(warehouse_url, api, [], "evolve")
    assert (emptied.deleted, emptied.row_count) == (2, 0)
    again = sync(warehouse_url, api, AFTER, "evolve")
    assert (again.inserted, again.drift) == (2, {"score": "bigint"})
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT id, score FROM items ORDER BY id") == [(1, "7"), (2, "9")]


def test_discard_keeps_the_field_in_the_raw_payload_only(
    warehouse_url: str, api: ApiServer
) -> None:
    sync(warehouse_url, api, BEFORE, "discard")
    stats = sync(warehouse_url, api, AFTER, "discard")
    assert (stats.drift, stats.changed) == ({"score": "bigint"}, 0)
    assert ("score", "bigint", "discarded") in fields(warehouse_url)
    with connect(warehouse_url) as wh:
        columns = [
            r[0]
            for r in wh.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'items'"
            )
        ]
    assert "score" not in columns


def test_freeze_stops_the_sync_and_stores_nothing(warehouse_url: str, api: ApiServer) -> None:
    sync(warehouse_url, api, BEFORE, "freeze")
    with pytest.raises(PayloadError, match=r"new payload fields \['score'\].*frozen"):
        sync(warehouse_url, api, AFTER + [{"id": 3, "name": "c", "score": 1}], "freeze")
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT count(*) FROM items") == [(2,)]
    assert [f for f, _, _ in fields(warehouse_url)] == ["id", "name"]


def test_a_field_that_changes_kind_does_not_break_the_source(
    warehouse_url: str, api: ApiServer
) -> None:
    sync(warehouse_url, api, BEFORE, "evolve")
    sync(warehouse_url, api, AFTER, "evolve")
    words = [{"id": 1, "name": "a", "score": "n/a"}, {"id": 2, "name": "b2", "score": 7.5}]
    stats = sync(warehouse_url, api, words, "evolve")
    assert stats.updated == 1  # b -> b2; the score is not part of the content
    with connect(warehouse_url) as wh:
        # Row 1 did not change, but its payload did: the evolved column follows it.
        assert wh.fetch("SELECT score FROM items ORDER BY id") == [("n/a",), ("7.5",)]


def test_declaring_a_drifted_field_makes_it_an_ordinary_column(
    warehouse_url: str, api: ApiServer
) -> None:
    sync(warehouse_url, api, BEFORE, "evolve")
    sync(warehouse_url, api, AFTER, "evolve")
    api.queue("/items", Reply.json(AFTER + [{"id": 3, "name": "c", "score": 1}]))
    config = RestSourceConfig.model_validate(
        {
            "name": "items",
            "type": "rest",
            "table": "items",
            "base_url": api.base_url,
            "path": "/items",
            "primary_key": "id",
            "columns": {"id": "bigint", "name": "text", "score": "text"},
        }
    )
    with connect(warehouse_url) as wh:
        stats = run_sync(wh, RestSource(config))
        assert wh.fetch("SELECT score FROM items WHERE id = 3") == [("1",)]
    assert stats.inserted == 1


def test_camel_case_fields_evolve_as_snake_case_columns(warehouse_url: str, api: ApiServer) -> None:
    sync(warehouse_url, api, BEFORE, "evolve")
    drifted = [
        {**record, "supplierRef": f"S-{record['id']}", "HTTPCode": 200, "Name": "x", "_rev": 3}
        for record in BEFORE
    ]
    stats = sync(warehouse_url, api, drifted, "evolve")
    assert stats.changed == 0
    new_row = {"id": 3, "name": "c", "supplierRef": "S-3", "HTTPCode": 404}
    assert sync(warehouse_url, api, [*drifted, new_row], "evolve").inserted == 1
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT id, supplier_ref, http_code FROM items ORDER BY id") == [
            (1, "S-1", "200"),
            (2, "S-2", "200"),
            (3, "S-3", "404"),
        ]
    assert ("supplierRef", "text", "evolved") in fields(warehouse_url)
    assert ("_rev", "bigint", "discarded") in fields(warehouse_url)
    # The drift event says what became of each field, and why one stays raw-only.
    assert stats.drift_actions == {
        "supplierRef": "column supplier_ref",
        "HTTPCode": "column http_code",
        "Name": "raw only: column 'name' is a declared column",
        "_rev": "raw only: '_rev' is no column name",
    }


@pytest.mark.parametrize("mode", ["evolve", "discard"])
def test_raw_follows_undeclared_fields_without_a_change(
    warehouse_url: str, api: ApiServer, mode: str
) -> None:
    sync(warehouse_url, api, [{"id": 1, "name": "a", "note": "x"}, {"id": 2, "name": "b"}], mode)
    stats = sync(warehouse_url, api, [{"id": 1, "name": "a", "note": "y"}, *BEFORE[1:]], mode)
    assert (stats.changed, stats.unchanged) == (0, 2)
    with connect(warehouse_url) as wh:
        raw = wh.fetch("SELECT CAST(_raw AS TEXT) FROM items WHERE id = 1")[0][0]
        assert json.loads(raw) == {"id": 1, "name": "a", "note": "y"}
        assert wh.fetch("SELECT count(*) FROM items_changes") == [(2,)]  # the two inserts
    # Evolved columns are read from the payload, so they follow it too.
    sync(warehouse_url, api, [{"id": 1, "name": "a", "note": "y", "score": 1}, *BEFORE[1:]], mode)
    sync(warehouse_url, api, [{"id": 1, "name": "a", "note": "z", "score": 2}, *BEFORE[1:]], mode)
    with connect(warehouse_url) as wh:
        raw = wh.fetch("SELECT CAST(_raw AS TEXT) FROM items WHERE id = 1")[0][0]
        assert json.loads(raw)["score"] == 2
        if mode == "evolve":
            assert wh.fetch("SELECT score FROM items WHERE id = 1") == [("2",)]
        assert wh.fetch("SELECT count(*) FROM items_changes") == [(2,)]


def test_raw_refresh_writes_only_payloads_that_moved(warehouse_url: str, api: ApiServer) -> None:
    # A stored payload is written back only when its hash differs from upstream's (or is not
    # stored yet), so an unchanged re-sync of a big table writes no payloads.
    records = [{"id": i, "name": n, "note": "x"} for i, n in ((1, "a"), (2, "b"), (3, "c"))]
    sync(warehouse_url, api, records, "discard")
    marker = {"marker": True}
    with connect(warehouse_url) as wh, wh.transaction():
        assert wh.fetch("SELECT count(*) FROM items WHERE _raw_hash IS NULL") == [(0,)]
        # Rows 1 and 2 now hold a payload upstream never sent; row 1 keeps the hash of the
        # payload synced (so the sync takes it for upstream's), row 2's hash is not known.
        raw = f"CAST('{json.dumps(marker)}' AS JSON)"
        wh.execute(f"UPDATE items SET _raw = {raw} WHERE id = 1")
        wh.execute(f"UPDATE items SET _raw = {raw}, _raw_hash = NULL WHERE id = 2")
    moved = {**records[2], "note": "y"}
    stats = sync(warehouse_url, api, [*records[:2], moved], "discard")
    assert (stats.changed, stats.unchanged) == (0, 3)
    with connect(warehouse_url) as wh:
        stored = wh.fetch("SELECT id, CAST(_raw AS TEXT) FROM items ORDER BY id")
        assert {i: json.loads(raw) for i, raw in stored} == {1: marker, 2: records[1], 3: moved}
        assert wh.fetch("SELECT count(*) FROM items WHERE _raw_hash IS NULL") == [(0,)]


def test_a_table_from_before_payload_hashes_gets_them_on_the_next_sync(
    warehouse_url: str, api: ApiServer
) -> None:
    sync(warehouse_url, api, BEFORE, "discard")
    with connect(warehouse_url) as wh, wh.transaction():
        wh.execute("ALTER TABLE items DROP COLUMN _raw_hash")
    # As a new release's process would: this one remembers having made the table on PostgreSQL.
    forget_tables()
    stats = sync(warehouse_url, api, AFTER, "discard")
    assert (stats.changed, stats.columns_added) == (0, ())
    with connect(warehouse_url) as wh:
        assert wh.fetch("SELECT count(*) FROM items WHERE _raw_hash IS NOT NULL") == [(2,)]
        raws = wh.fetch("SELECT CAST(_raw AS TEXT) FROM items ORDER BY id")
        assert [json.loads(raw) for (raw,) in raws] == AFTER
