"""The `where` language: accepted filters run on real DuckDB and PostgreSQL change logs, hostile
or invalid ones are refused at compile time, before anything reaches a database."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import adbc_driver_postgresql.dbapi
import duckdb
import polars as pl
import pytest
import yaml
from changewatch.evaluators import filters
from changewatch.evaluators.filters import (
    CompiledFilter,
    FilterError,
    check_filter_runs,
    compile_filter,
)
from changewatch.warehouse.backends import Warehouse, connect
from changewatch.warehouse.schema import SQL_TYPES
from changewatch.warehouse.statements import quote, render

CASES = Path(__file__).parent / "filter_cases"
FIXTURE = yaml.safe_load((CASES / "changes.yaml").read_text())
COLUMNS: dict[str, str] = FIXTURE["columns"]
ACCEPTED: list[dict[str, Any]] = yaml.safe_load((CASES / "accepted.yaml").read_text())
REFUSED: list[dict[str, Any]] = yaml.safe_load((CASES / "refused.yaml").read_text())

POLARS_TYPES = {
    "text": pl.String,
    "bigint": pl.Int64,
    "integer": pl.Int32,
    "timestamp": pl.Datetime("us", "UTC"),
    "text[]": pl.List(pl.String),
}
_AGO = re.compile(r"^(\d+) (hour|day)s?$")


def _fixture_frame(now: datetime) -> pl.DataFrame:
    """changes.yaml as a frame shaped like the staged change rows warehouse/sync.py writes."""
    schema: dict[str, Any] = {
        "change_id": pl.Int64,
        "sync_id": pl.String,
        "kind": pl.String,
        "object_key": pl.String,
        "old_hash": pl.String,
        "new_hash": pl.String,
        "changed_columns": pl.List(pl.String),
        "detected_at": pl.Datetime("us", "UTC"),
    }
    for name, kind in COLUMNS.items():
        schema[f"old_{name}"] = schema[f"new_{name}"] = POLARS_TYPES[kind]
    rows = []
    for change in FIXTURE["changes"]:
        amount, unit = _AGO.match(change["detected"]).groups()  # type: ignore[union-attr]
        row: dict[str, Any] = {
            "change_id": change["change_id"],
            "sync_id": "sync-1",
            "kind": change["kind"],
            "object_key": change["object_key"],
            "old_hash": None if change["kind"] == "insert" else f"old-{change['change_id']}",
            "new_hash": None if change["kind"] == "delete" else f"new-{change['change_id']}",
            "changed_columns": change.get("changed_columns"),
            "detected_at": now - timedelta(**{f"{unit}s": int(amount)}),
        }
        for side in ("old", "new"):
            values = change.get(side) or {}
            for name, kind in COLUMNS.items():
                value = values.get(name)
                if kind == "timestamp" and value is not None:
                    value = datetime.fromisoformat(value)
                row[f"{side}_{name}"] = value
        rows.append(row)
    return pl.DataFrame(rows, schema=schema, orient="row")


def _load_fixture(wh: Warehouse) -> None:
    """Create `issues_changes` with the real DDL of sql/create_changes.sql and fill it."""
    value_defs = ", ".join(
        f"{quote(prefix + name)} {SQL_TYPES[kind]}"
        for name, kind in COLUMNS.items()
        for prefix in ("old_", "new_")
    )
    frame = _fixture_frame(datetime.now(UTC))
    columns = ", ".join(quote(c) for c in frame.columns)
    with wh.transaction():
        wh.execute(
            render("create_changes", wh.dialect, changes='"issues_changes"', value_defs=value_defs)
        )
        wh.stage("filter_fixture", frame)
        wh.execute(f"INSERT INTO issues_changes ({columns}) SELECT {columns} FROM filter_fixture")
        wh.unstage("filter_fixture")


def _case_id(case: dict[str, Any]) -> str:
    return case["where"] or "<empty>"


def test_fixture_files_are_well_formed() -> None:
    assert len(REFUSED) >= 30
    ids = [change["change_id"] for change in FIXTURE["changes"]]
    for case in ACCEPTED:
        assert set(case) == {"where", "matches"}, case
        assert set(case["matches"]) <= set(ids) and case["matches"] == sorted(case["matches"])
    for case in REFUSED:
        assert set(case) == {"where", "error"} and case["error"], case


def test_accepted_filters_match_the_expected_changes(warehouse_url: str) -> None:
    failures = []
    with connect(warehouse_url) as wh:
        _load_fixture(wh)
        for case in ACCEPTED:
            compiled = compile_filter(case["where"], watch="accepted", columns=COLUMNS)
            condition = compiled.to_sql(wh.dialect)  # type: ignore[arg-type]
            query = (
                f"SELECT change_id FROM issues_changes AS c WHERE {condition} ORDER BY change_id"
            )
            try:
                with wh.transaction():  # a failed query must not poison the next (PostgreSQL)
                    got = [row[0] for row in wh.fetch(query)]
            except Exception as error:
                failures.append(f"{case['where']!r}: {error}\n    SQL: {condition}")
                continue
            if got != case["matches"]:
                failures.append(
                    f"{case['where']!r}: matched {got}, expected {case['matches']}\n"
                    f"    SQL: {condition}"
                )
        # The literals that look like SQL stayed literals: the table is intact.
        assert wh.fetch("SELECT count(*) FROM issues_changes") == [(len(FIXTURE["changes"]),)]
    assert not failures, f"{wh.dialect}:\n" + "\n".join(failures)


@pytest.mark.parametrize("case", REFUSED, ids=_case_id)
def test_refused_filters_name_the_watch_and_the_problem(case: dict[str, Any]) -> None:
    with pytest.raises(FilterError) as refused:
        compile_filter(case["where"], watch="hostile", columns=COLUMNS)
    message = str(refused.value)
    assert message.startswith("watch 'hostile': where: "), message
    assert case["error"] in message
    assert "<class" not in message and "sqlglot" not in message, message


def test_compiling_never_touches_a_database(monkeypatch: pytest.MonkeyPatch) -> None:
    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError("compile_filter or to_sql opened a database connection")

    monkeypatch.setattr(duckdb, "connect", tripwire)
    monkeypatch.setattr(adbc_driver_postgresql.dbapi, "connect", tripwire)
    for case in REFUSED:
        with pytest.raises(FilterError):
            compile_filter(case["where"], watch="hostile", columns=COLUMNS)
    for case in ACCEPTED:
        compiled = compile_filter(case["where"], watch="accepted", columns=COLUMNS)
        compiled.to_sql("duckdb")
        compiled.to_sql("postgres")
    import changewatch.evaluators.filters as module

    assert not {"duckdb", "adbc_driver_postgresql", "warehouse"} & set(vars(module))


def test_bare_column_and_array_containment_per_dialect() -> None:
    compiled = compile_filter(
        "state = 'closed' AND 'bug' IN new.labels", watch="w", columns=COLUMNS
    )
    bare = """CASE WHEN c."kind" = 'delete' THEN c."old_state" ELSE c."new_state" END"""
    assert compiled.to_sql("duckdb") == (
        f"""{bare} = 'closed' AND LIST_CONTAINS(c."new_labels", 'bug')"""
    )
    assert compiled.to_sql("postgres") == f"""{bare} = 'closed' AND ('bug' = ANY(c."new_labels"))"""
    assert compiled.to_sql("postgres", alias="chg").count('chg."') == 4


def test_changed_per_dialect() -> None:
    compiled = compile_filter("changed(title)", watch="w", columns=COLUMNS)
    assert compiled.to_sql("duckdb") == (
        """(c."kind" <> 'update' OR COALESCE(LIST_CONTAINS(c."changed_columns", 'title'), FALSE))"""
    )
    assert compiled.to_sql("postgres") == (
        """(c."kind" <> 'update' OR COALESCE(('title' = ANY(c."changed_columns")), FALSE))"""
    )


def test_compiled_filter_records_the_columns_it_uses() -> None:
    compiled = compile_filter(
        "kind = 'update' AND changed(state) AND old.comments < new.comments "
        "AND cardinality(labels) > 0 AND detected_at > now() - INTERVAL '1 hour'",
        watch="busy",
        columns=COLUMNS,
    )
    assert isinstance(compiled, CompiledFilter)
    assert (compiled.watch, compiled.columns) == ("busy", {"state", "comments", "labels"})
    assert compiled == compile_filter(compiled.text, watch="busy", columns=COLUMNS)
    assert compile_filter("TRUE", watch="w", columns=COLUMNS).columns == frozenset()


def test_a_declared_column_named_like_a_change_field_is_reached_through_old_and_new() -> None:
    columns = {"kind": "text", "size": "bigint"}
    compiled = compile_filter("kind = 'update' AND new.kind = 'bug'", watch="w", columns=columns)
    assert compiled.columns == {"kind"}
    assert compiled.to_sql("duckdb") == """c."kind" = 'update' AND c."new_kind" = 'bug'"""


def test_a_boolean_column_is_a_condition() -> None:
    columns = {"draft": "boolean", "title": "text"}
    assert compile_filter("NOT draft", watch="w", columns=columns).columns == {"draft"}
    assert compile_filter("old.draft AND NOT new.draft", watch="w", columns=columns)
    with pytest.raises(FilterError, match="title is not a condition"):
        compile_filter("title", watch="w", columns=columns)


def test_to_sql_refuses_unknown_dialects_and_unsafe_aliases() -> None:
    compiled = compile_filter("TRUE", watch="w", columns=COLUMNS)
    with pytest.raises(ValueError, match="dialect"):
        compiled.to_sql("sqlite")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alias"):
        compiled.to_sql("duckdb", alias='c"; DROP TABLE x; --')


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("(" * 200 + "TRUE" + ")" * 200, "is nested too deeply"),
        ("NOT " * 2000 + "TRUE", "is nested too deeply"),
        (" OR ".join(["kind = 'insert'"] * 1000), "is longer than 10000 characters"),
    ],
    ids=["parentheses", "nots", "long"],
)
def test_oversized_filters_are_refused_cleanly(text: str, error: str) -> None:
    with pytest.raises(FilterError, match=f"^watch 'big': where: {error}"):
        compile_filter(text, watch="big", columns=COLUMNS)


def test_a_filter_that_bound_once_is_still_checked_over_other_columns() -> None:
    """Binding is remembered per filter text and columns: the same text over columns of
    other types is bound again, and refused where it does not run."""
    text = "lower(number) = 'x'"
    as_text = compile_filter(text, watch="w", columns={"number": "text"})
    for _ in range(2):  # the second time from memory
        check_filter_runs(as_text, {"number": "text"})
    assert ((("number", "text"),), as_text.to_sql("duckdb")) in filters._RAN
    as_number = compile_filter(text, watch="w", columns={"number": "bigint"})
    for _ in range(2):  # a refusal is never remembered as a pass
        with pytest.raises(FilterError, match="does not run"):
            check_filter_runs(as_number, {"number": "bigint"})
