"""A value is stored exactly or not at all: 3.7 never becomes 4 in an integer column, 1 never
true in a boolean one; the sync fails naming source, record key and column, and keeps what it
had stored."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from apiserver import ApiServer, Reply
from changewatch.sources.base import FetchResult, SourceBase
from changewatch.sources.errors import PayloadError
from changewatch.sources.normalize import normalize
from changewatch.sources.rest import RestSource, RestSourceConfig
from changewatch.warehouse import connect
from changewatch.warehouse.sync import run_sync

COLUMNS = {
    "sku": "text",
    "qty": "integer",
    "price": "double",
    "active": "boolean",
    "n": "bigint",
    "ids": "bigint[]",
    "bin_ids": {"type": "bigint[]", "path": "bins[].id"},
}


def typed(**record: Any) -> tuple[Any, ...]:
    config = SourceBase.model_validate(
        {
            "name": "stock",
            "type": "rest",
            "table": "stock",
            "primary_key": "sku",
            "columns": COLUMNS,
        }
    )
    fetched = FetchResult.from_records([{"sku": "a", **record}])
    frame = normalize(fetched, config, synced_at=datetime(2026, 1, 1, tzinfo=UTC))
    # Each field's column: bins[].id is read into bin_ids.
    return frame.select("bin_ids" if f == "bins" else f for f in record).row(0)


@pytest.mark.parametrize(
    ("record", "stored"),
    [
        ({"qty": 4.0, "n": 1e3}, (4, 1000)),  # whole numbers, whatever their spelling
        ({"qty": "7", "n": "-12"}, (7, -12)),  # numeric strings holding whole numbers
        ({"price": "2.5"}, (2.5,)),  # numeric strings in a double column
        ({"price": 3}, (3.0,)),
        ({"active": False}, (False,)),
        ({"active": "true"}, (True,)),
        ({"qty": None, "active": None}, (None, None)),
        ({"ids": [1, "2", 3.0, None], "bins": [{"id": 4}]}, ([1, 2, 3, None], [4])),
        ({"ids": []}, ([],)),
    ],
)
def test_values_that_fit_exactly_are_stored(record: dict[str, Any], stored: tuple) -> None:
    assert typed(**record) == stored


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"qty": 3.7}, "field 'qty' value 3.7 is not an integer"),
        ({"qty": "3.7"}, "field 'qty' value '3.7' is not an integer"),
        ({"qty": True}, "field 'qty' value True is not an integer"),
        ({"n": -2.5}, "field 'n' value -2.5 is not a bigint"),
        ({"price": True}, "field 'price' value True is not a double"),
        ({"active": 1}, "field 'active' value 1 is not a boolean"),
        ({"ids": [1, 2.5]}, "field 'ids' value [1, 2.5] is not a bigint[]"),
        ({"ids": [1, "x"]}, "field 'ids' value [1, 'x'] is not a bigint[]"),
        ({"bins": [{"id": 4}, {"id": 4.5}]}, "field 'bin_ids' value [4, 4.5] is not a bigint[]"),
    ],
)
def test_values_that_would_change_are_record_errors(record: dict[str, Any], message: str) -> None:
    with pytest.raises(PayloadError) as error:
        typed(**record)
    assert f"source 'stock': document 1 record #0 (key {{'sku': 'a'}}): {message}" in str(
        error.value
    )


def test_a_lossy_value_fails_the_sync_and_keeps_what_was_stored(warehouse_url: str) -> None:
    with ApiServer() as api:
        config = RestSourceConfig.model_validate(
            {
                "name": "stock",
                "type": "rest",
                "table": "stock",
                "base_url": api.base_url,
                "path": "/stock",
                "primary_key": "sku",
                "columns": {"sku": "text", "qty": "integer", "modified": "text"},
            }
        )

        def sync(*records: dict[str, Any]) -> Any:
            api.queue("/stock", Reply.json(list(records)))
            with connect(warehouse_url) as wh:
                return run_sync(wh, RestSource(config))

        assert sync({"sku": "a", "qty": 3, "modified": "mon"}).inserted == 1
        with pytest.raises(PayloadError, match=r"\(key \{'sku': 'a'\}\): field 'qty' value 3.7"):
            sync({"sku": "a", "qty": 3.7, "modified": "tue"})
        with pytest.raises(PayloadError, match="field 'qty' value 4.2 is not an integer"):
            sync({"sku": "a", "qty": 4.2, "modified": "wed"})
        with connect(warehouse_url) as wh:
            assert wh.fetch("SELECT sku, qty, modified FROM stock") == [("a", 3, "mon")]
            assert wh.fetch("SELECT count(*) FROM stock_changes") == [(1,)]
            assert wh.fetch("SELECT status FROM sync_runs ORDER BY started_at") == [
                ("succeeded",),
                ("failed",),
                ("failed",),
            ]
        fixed = sync({"sku": "a", "qty": "5", "modified": "thu"})
        assert fixed.updated == 1
        with connect(warehouse_url) as wh:
            assert wh.fetch(
                "SELECT old_qty, new_qty, changed_columns FROM stock_changes ORDER BY change_id"
            ) == [
                (None, 3, None),
                (3, 5, ["qty", "modified"]),
            ]
