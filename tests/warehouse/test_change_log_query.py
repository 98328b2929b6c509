"""A first sync's change log (every fetched row new) has its own, narrower stage query: it must
give the entries the general query gives, in the same order, with the columns it leaves out
empty there."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from changewatch.sources.base import FetchResult, SourceBase
from changewatch.sources.stream import StreamingNormalizer
from changewatch.warehouse.sync import _change_log_query, _create_diff

SYNCED_AT = datetime(2026, 3, 1, tzinfo=UTC)
PARAMS = [41, "s-1", SYNCED_AT, False, True]


def records() -> list[dict]:
    """Ties on updated-at, missing updated-ats, keys that sort differently as text."""
    stamps = ["2026-01-02T00:00:00Z", None, "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]
    return [
        {
            "org": ["b", "a"][n % 2],
            "id": n,
            "title": f"t{n}",
            "meta": {"n": n},
            "tags": [f"x{n}"],
            "updated_at": stamps[n % 4],
        }
        for n in (3, 12, 1, 20, 2, 7, 100, 9)
    ]


def config(keys: list[str], updated_at: str | None) -> SourceBase:
    return SourceBase(
        name="s",
        type="rest",
        table="t",
        primary_key=keys,
        updated_at=updated_at,
        columns={
            "org": "text",
            "id": "bigint",
            "title": "text",
            "meta": "json",
            "tags": "text[]",
            "updated_at": "timestamp",
        },
    )


@pytest.mark.parametrize(
    ("keys", "updated_at"),
    [(["id"], "updated_at"), (["org", "id"], "updated_at"), (["id"], None)],
)
def test_the_inserts_only_query_gives_the_general_querys_entries(
    keys: list[str], updated_at: str | None
) -> None:
    source = config(keys, updated_at)
    with StreamingNormalizer(source, batch_bytes=1) as pages:
        documents = [orjson.dumps(records()[:5]), orjson.dumps(records()[5:])]
        for document in documents:
            pages.add(document, None)
        staged, _ = pages.finish(FetchResult(documents=[], streamed=2), synced_at=SYNCED_AT)
        # What apply_sync stages for a first sync: nothing stored, so every row an insert.
        key_list = ", ".join(f'"{k}"' for k in keys)
        staged.execute(
            f"CREATE TABLE stored AS SELECT {key_list}, _content_hash FROM fetched LIMIT 0"
        )
        _create_diff(staged, keys, complete=True)
        columns = ", ".join(f'"{c}"' for c in source.columns)
        staged.execute(f"CREATE TABLE old_rows AS SELECT {columns} FROM fetched LIMIT 0")
        general = staged.arrow(_change_log_query(source), PARAMS).to_pylist()
        general.sort(key=lambda entry: entry["change_id"])
        narrow = staged.arrow(_change_log_query(source, inserts_only=True), PARAMS)

    assert len(general) == 8 and [e["change_id"] for e in general] == list(range(41, 49))
    left_out = set(general[0]) - set(narrow.schema.names)
    assert left_out == {"old_hash", "changed_columns"} | {f"old_{c}" for c in source.columns}
    assert all(entry[c] is None for entry in general for c in left_out)
    by_id = sorted(narrow.to_pylist(), key=lambda entry: entry["change_id"])
    assert by_id == [{c: entry[c] for c in narrow.schema.names} for entry in general]
    if updated_at:  # numbered by updated-at (missing last), then key
        stamps = [e["new_updated_at"] for e in by_id]
        assert stamps == sorted(stamps, key=lambda s: (s is None, s))
