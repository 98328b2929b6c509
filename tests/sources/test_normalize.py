"""Normalization: typed columns from payload paths, one row per key, and the content hash."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import polars as pl
import pytest
from changewatch.sources.base import FetchResult, SourceBase
from changewatch.sources.errors import PayloadError
from changewatch.sources.normalize import (
    HASH_COLUMN,
    RAW_COLUMN,
    normalize_batch,
    normalize_into,
)
from changewatch.sources.normalize import normalize as normalize_fetch
from polars.testing import assert_frame_equal

FIXTURES = Path(__file__).parent / "fixtures"
SYNCED_AT = datetime(2026, 2, 1, tzinfo=UTC)


def issue_source(**overrides: object) -> SourceBase:
    settings: dict[str, object] = {
        "name": "gh",
        "type": "rest",
        "table": "issues",
        "primary_key": "number",
        "updated_at": "updated_at",
        "columns": {
            "number": "bigint",
            "title": "text",
            "state": "text",
            "labels": {"type": "text[]", "path": "labels[].name"},
            "assignee": {"type": "text", "path": "assignee.login"},
            "comments": "integer",
            "updated_at": "timestamp",
            "closed_at": "timestamp",
        },
    }
    return SourceBase.model_validate(settings | overrides)


def normalize(records: list[dict], config: SourceBase, *, synced_at: datetime) -> pl.DataFrame:
    return normalize_fetch(FetchResult.from_records(records), config, synced_at=synced_at)


def load(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())


def test_payload_becomes_typed_columns() -> None:
    frame = normalize(load("github_issues_page.json"), issue_source(), synced_at=SYNCED_AT)
    expected = load("github_issues_expected.json")
    as_text = frame.drop(HASH_COLUMN, "_synced_at", RAW_COLUMN).with_columns(
        pl.col("updated_at", "closed_at").dt.to_string("%Y-%m-%dT%H:%M:%S+00:00")
    )
    assert as_text.to_dicts() == expected
    assert frame.schema["number"] == pl.Int64
    assert frame.schema["labels"] == pl.List(pl.String)
    assert frame.schema["updated_at"] == pl.Datetime("us", "UTC")
    # The raw payload is kept whole, including fields no column declares.
    assert json.loads(frame[RAW_COLUMN][0])["user"] == {"login": "bob"}


def test_content_hash_is_pinned() -> None:
    # If this changes, every stored row would look "updated" after an upgrade: a real break.
    # The definition: SHA-256 of the normalized fields as compact JSON with sorted keys.
    frame = normalize(load("github_issues_page.json"), issue_source(), synced_at=SYNCED_AT)
    canonical = (
        '{"assignee":"ada","closed_at":null,"comments":3,"labels":["bug","security"],'
        '"number":1,"state":"open","title":"Crash on start",'
        '"updated_at":"2026-01-02 10:00:00+00"}'
    )
    assert frame[HASH_COLUMN][0] == hashlib.sha256(canonical.encode()).hexdigest()
    assert frame[HASH_COLUMN].to_list() == [
        "ab7bc74e8bcf984ed8cc0f0e1d3910275c734c4c90e9cbb71a96ce33a9afd93e",
        "ec35bbbabf4aa4e8e6e8427a85eedab2efe5abbec9edee3c3976d8568e53c3ec",
    ]


def test_hash_ignores_undeclared_fields_and_column_order() -> None:
    records = load("github_issues_page.json")
    before = normalize(records, issue_source(), synced_at=SYNCED_AT)[HASH_COLUMN]
    for record in records:
        record["reactions"] = {"+1": 5}  # a field upstream added that no column declares
    reordered = issue_source()
    reordered.columns = dict(reversed(list(reordered.columns.items())))
    after = normalize(records, reordered, synced_at=SYNCED_AT)[HASH_COLUMN]
    assert before.to_list() == after.to_list()


def test_hash_follows_every_declared_field() -> None:
    records = load("github_issues_page.json")
    before = normalize(records, issue_source(), synced_at=SYNCED_AT)[HASH_COLUMN].to_list()
    records[0]["labels"].append({"name": "docs"})
    records[1]["assignee"] = {"login": "zed"}
    after = normalize(records, issue_source(), synced_at=SYNCED_AT)[HASH_COLUMN].to_list()
    assert before[0] != after[0] and before[1] != after[1]


def test_hash_tells_null_from_empty() -> None:
    source = issue_source(columns={"number": "bigint", "title": "text"}, updated_at=None)
    frame = normalize(
        [{"number": 1, "title": None}, {"number": 2, "title": ""}], source, synced_at=SYNCED_AT
    )
    hashes = frame.drop("number").select(HASH_COLUMN)
    assert hashes[HASH_COLUMN].n_unique() == 2


def test_documents_split_at_records_path() -> None:
    pages = [
        {"data": {"items": load("github_issues_page.json")[:1]}},
        {"data": {"items": load("github_issues_page.json")[1:]}},
    ]
    fetched = FetchResult(
        documents=[json.dumps(p).encode() for p in pages], records_path="data.items"
    )
    frame = normalize_fetch(fetched, issue_source(), synced_at=SYNCED_AT)
    assert frame["number"].to_list() == [1, 2]


def test_document_that_is_not_json_is_named() -> None:
    fetched = FetchResult(documents=[b"[]", b"<html>rate limited</html>"])
    with pytest.raises(PayloadError, match="source 'gh': document 2 is not JSON"):
        normalize_fetch(fetched, issue_source(), synced_at=SYNCED_AT)


def test_document_that_is_not_utf8_is_named() -> None:
    # JSON is UTF-8: a Latin-1 body is named like any document that is not JSON.
    latin1 = json.dumps([{"number": 1, "title": "café"}], ensure_ascii=False).encode("latin-1")
    fetched = FetchResult(documents=[b"[]", b"[]", latin1])
    with pytest.raises(PayloadError) as error:
        normalize_fetch(fetched, issue_source(), synced_at=SYNCED_AT)
    assert "source 'gh': document 3 is not JSON (not UTF-8 text" in str(error.value)


def test_object_seen_twice_keeps_newest_version() -> None:
    records = load("github_issues_page.json")
    newer = dict(records[0], title="Crash on start (fixed)", updated_at="2026-01-05T00:00:00Z")
    # The newer version arrives first: the walk saw it on page 1, the old one on page 2.
    frame = normalize([newer, records[1], records[0]], issue_source(), synced_at=SYNCED_AT)
    assert frame.height == 2
    assert frame.filter(pl.col("number") == 1)["title"].to_list() == ["Crash on start (fixed)"]


def test_json_column_keeps_subdocument() -> None:
    source = issue_source(columns={"number": "bigint", "meta": "json"}, updated_at=None)
    frame = normalize([{"number": 1, "meta": {"b": 1, "a": [1, 2]}}], source, synced_at=SYNCED_AT)
    assert json.loads(frame["meta"][0]) == {"a": [1, 2], "b": 1}


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"number": "seven", "updated_at": "2026-01-01T00:00:00Z"},
            "document 1 record #0 (key {'number': 'seven'}): field 'number' value 'seven'",
        ),
        (
            {"number": 1, "updated_at": "last tuesday"},
            "field 'updated_at' value 'last tuesday' is not a timestamp",
        ),
        ({"title": "no key", "updated_at": "2026-01-01T00:00:00Z"}, "record #0 has no primary key"),
    ],
)
def test_bad_records_are_named(record: dict, message: str) -> None:
    with pytest.raises(PayloadError) as error:
        normalize([record], issue_source(), synced_at=SYNCED_AT)
    assert message in str(error.value)
    assert "'gh'" in str(error.value)


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("2026-01-01T00:00:00+02:00", datetime(2025, 12, 31, 22, tzinfo=UTC)),
        ("2026-01-01 00:00:00 America/New_York", datetime(2026, 1, 1, 5, tzinfo=UTC)),
        ("2026-01-01", datetime(2026, 1, 1, tzinfo=UTC)),
        (None, None),
    ],
)
def test_timestamps_are_read_from_their_text(value: str | None, stored: datetime | None) -> None:
    record = {"number": 1, "updated_at": "2026-01-01T00:00:00Z", "closed_at": value}
    frame = normalize([record], issue_source(), synced_at=SYNCED_AT)
    assert frame["closed_at"].to_list() == [stored]
    missing = normalize([{"number": 1}], issue_source(), synced_at=SYNCED_AT)
    assert missing["closed_at"].to_list() == [None]


@pytest.mark.parametrize("value", [1767225600, True, "", "2026-02-30T00:00:00Z", {"at": "x"}])
def test_a_value_that_is_no_timestamp_is_a_record_error(value: object) -> None:
    record = {"number": 1, "updated_at": "2026-01-01T00:00:00Z", "closed_at": value}
    with pytest.raises(PayloadError, match="field 'closed_at' value .* is not a timestamp"):
        normalize([record], issue_source(), synced_at=SYNCED_AT)


def test_empty_fetch_gives_typed_empty_frame() -> None:
    frame = normalize([], issue_source(), synced_at=SYNCED_AT)
    assert frame.height == 0
    assert frame.schema["labels"] == pl.List(pl.String)


def into_table(documents: list[bytes], config: SourceBase, **options: object) -> tuple:
    """``normalize_into`` writing table ``out``: its fields, and the table's rows."""
    with duckdb.connect() as con:
        fields = normalize_into(
            lambda rows: con.execute(f"CREATE TABLE out AS {rows}"),
            documents,
            None,
            config,
            connection=con,
            first_document=3,
            **options,
        )
        return fields, pl.from_arrow(con.sql("FROM out").to_arrow_table())


def tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]


def test_rows_normalized_inside_duckdb_are_normalize_batch_rows() -> None:
    # What a sync's stage gets without the rows leaving DuckDB: the same values, hashes and
    # payloads as the frame, and the same payload fields (with types for unknown ones).
    records = load("github_issues_page.json")
    documents = [
        json.dumps(r).encode() for r in (records[:1], [*records[1:], {"number": 9, "x": 1}])
    ]
    expected = normalize_batch(
        documents, None, issue_source(), first_document=3, known_fields=["id"]
    )
    fields, out = into_table(documents, issue_source(), known_fields=["id"])
    assert_frame_equal(out.sort("_arrival"), expected.frame.drop("_bad_value").sort("_arrival"))
    assert fields == expected.fields
    assert fields["x"] == "UBIGINT"


@pytest.mark.parametrize(
    "document",
    [
        b'[{"number": 1}, {"number": 2.5}, {"number": "x"}]',  # bad values
        b'[{"number": 1}, {"number": 2, "closed_at": "someday"}]',
        b'[{"number": 1}, {"title": "no key"}, {"title": "none either"}]',
        b"<html>rate limited</html>",
    ],
)
def test_a_bad_batch_writes_nothing_and_is_named_as_normalize_batch_names_it(
    document: bytes,
) -> None:
    documents = [json.dumps(load("github_issues_page.json")).encode(), document]
    with pytest.raises(PayloadError) as expected:
        normalize_batch(documents, None, issue_source(), first_document=3)
    with duckdb.connect() as con:
        with pytest.raises(PayloadError) as error:
            normalize_into(
                lambda rows: con.execute(f"CREATE TABLE out AS {rows}"),
                documents,
                None,
                issue_source(),
                connection=con,
                first_document=3,
            )
        assert tables(con) == []  # no `out`, and the batch's own tables are gone
    assert str(error.value) == str(expected.value)


def test_a_write_that_fails_on_its_own_is_not_blamed_on_the_records() -> None:
    with duckdb.connect() as con, pytest.raises(duckdb.CatalogException, match="no_such_table"):
        normalize_into(
            lambda rows: con.execute(f"INSERT INTO no_such_table {rows}"),
            [json.dumps(load("github_issues_page.json")).encode()],
            None,
            issue_source(),
            connection=con,
        )
