"""`changewatch sql` bounds what one call builds and what a query may take, so --timeout and
the memory limit hold (issue 30): refused before it runs, or one line when it runs."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from changewatch.pipeline.cli import sql_command as query_module
from changewatch.pipeline.cli.sql_command import QueryTooLarge
from changewatch.warehouse import connect
from test_sql_sandbox import query, run_cli


@pytest.fixture
def empty_warehouse(warehouse_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """An existing, empty warehouse on each backend."""
    connect(warehouse_url).close()
    monkeypatch.setenv("CHANGEWATCH_WAREHOUSE_URL", warehouse_url)
    return warehouse_url


@pytest.fixture
def duckdb_warehouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty DuckDB warehouse: the checks below run where DuckDB runs, in this process
    (PostgreSQL bounds a value itself, 1 GB, and its statement_timeout ends the statement)."""
    url = f"duckdb:///{tmp_path / 'warehouse.duckdb'}"
    connect(url).close()
    monkeypatch.setenv("CHANGEWATCH_WAREHOUSE_URL", url)
    return url


def test_a_huge_repeat_is_refused_at_once_with_exit_2(empty_warehouse: str, tmp_path: Path) -> None:
    for text in (
        "SELECT length(repeat('x', 1000000000))",
        "SELECT lpad('x', 2e9, 'y')",
        "SELECT length(repeat('x', 1000000000) || repeat('y', 1000000000))",
    ):
        done = run_cli("sql", text, "--timeout", "5", url=empty_warehouse, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "builds more than 1,000,000 characters or elements" in done.stderr
        assert len(done.stderr.splitlines()) == 1


def test_3000_nested_parentheses_are_nested_too_deeply(
    empty_warehouse: str, tmp_path: Path
) -> None:
    text = "SELECT " + "(" * 3000 + "1" + ")" * 3000
    done = run_cli("sql", text, url=empty_warehouse, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "changewatch: refused: the query is nested too deeply\n"


def test_a_count_computed_at_run_time_is_checked_where_it_runs(
    duckdb_warehouse: str, tmp_path: Path
) -> None:
    text = "SELECT length(repeat('x', n * 1000)) FROM (VALUES (1), (1000000)) AS v(n)"
    done = run_cli("sql", text, "--timeout", "5", url=duckdb_warehouse, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "changewatch: DuckDB: Invalid Input Error: changewatch sql: repeat would build more "
        "than 1,000,000 characters or elements (see docs/security.md)\n"
    )
    fine = "SELECT length(repeat('x', n * 1000)) AS n FROM (VALUES (1), (1000)) AS v(n)"
    assert query(fine, fmt="csv") == "n\n1000\n1000000\n"


def test_a_query_past_the_memory_limit_fails_in_one_line(
    empty_warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(query_module, "SQL_MEMORY", 256 << 20)
    before = resource.getrlimit(resource.RLIMIT_AS)
    # Each value within the bound of one call; a thousand of them is 1 GB.
    text = "SELECT repeat('x', 1000000) AS s FROM generate_series(1, 1000) AS g(n)"
    with pytest.raises(QueryTooLarge, match=r"^the query needed more than 256 MiB of memory"):
        query(text, fmt="csv")
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    assert query("SELECT 1 AS one", fmt="csv") == "one\n1\n"
