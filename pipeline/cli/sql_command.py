"""`changewatch sql`: one checked read on a sandboxed connection, shown as a table, CSV or JSON."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO

from changewatch.pipeline.cli.sql_memory_cap import memory_cap
from changewatch.pipeline.project.expected_errors import ChangewatchError, UsageError

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa
    from changewatch.warehouse import Warehouse

__all__ = [
    "DEFAULT_TIMEOUT",
    "FORMATS",
    "SQL_MEMORY",
    "QueryTimeout",
    "QueryTooLarge",
    "run_query",
    "single_statement",
]

FORMATS = ("table", "csv", "json")
# Seconds a query may run (`--timeout`): on PostgreSQL the server's statement_timeout, so a
# query whose client was killed ends by itself too.
DEFAULT_TIMEOUT = 60.0
# PostgreSQL's SQLSTATE for a statement cancelled by statement_timeout.
_QUERY_CANCELED = "57014"
_TIMED_OUT = "canceling statement due to statement timeout"
# Bytes of memory (address space) a query may add to this process (a DuckDB query runs in
# it; either backend's result is read into it): past it the query fails in one line instead
# of the machine running out.
SQL_MEMORY = 2 << 30
# How an allocation refused by that cap reads in DuckDB's and Arrow's errors (DuckDB's own
# memory_limit, of its buffers, says "could not allocate block" and names itself).
_PAST_THE_CAP = ("(bad allocation)", "ArrowBuffer: failed to allocate")
# What a terminal shows of a result: names and values (no shape, no types), cut to fit.
_SCREEN = {
    "tbl_rows": 50,
    "tbl_cols": 20,
    "fmt_str_lengths": 40,
    "tbl_width_chars": 160,
    "tbl_hide_dataframe_shape": True,
    "tbl_hide_column_data_types": True,
}
# Piped or redirected: every row, column and character.
_WHOLE = {
    "tbl_rows": -1,
    "tbl_cols": -1,
    "fmt_str_lengths": 1_000_000,
    "fmt_table_cell_list_len": -1,
    "tbl_width_chars": 65_535,  # polars' widest
}


class QueryTimeout(ChangewatchError):
    """The query ran past its time limit."""


class QueryTooLarge(ChangewatchError):
    """The query needed more memory than ``SQL_MEMORY``."""


def single_statement(query: str, dialect: str) -> str:
    """``query`` without a trailing ``;``; ``UsageError`` unless it is exactly one statement.

    Split with sqlglot's tokenizer, so a ``;`` inside a string or comment does not count.

    >>> single_statement("SELECT ';' AS s;", "duckdb")
    "SELECT ';' AS s"
    >>> try:
    ...     single_statement("SELECT 1; DROP TABLE sync_runs", "postgres")
    ... except UsageError as refused:
    ...     print(refused)
    the query holds 2 statements; give exactly one
    """
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.errors import TokenError
    from sqlglot.tokens import TokenType

    try:
        tokens = Dialect.get_or_raise(dialect).tokenize(query)
    except TokenError as error:
        raise UsageError(f"cannot read the query: {error}") from None
    statements, current = [], []
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            if current:
                statements.append(current)
            current = []
        else:
            current.append(token)
    if current:
        statements.append(current)
    if len(statements) != 1:
        raise UsageError(
            "the query is empty"
            if not statements
            else f"the query holds {len(statements)} statements; give exactly one"
        )
    return query[: statements[0][-1].end + 1].strip()


def run_query(
    query: str, *, fmt: str | None, timeout: float = DEFAULT_TIMEOUT, out: TextIO = sys.stdout
) -> None:
    """Check ``query`` (a read of the warehouse's tables, see ``warehouse.read_guard``), run it
    on a read-only, sandboxed connection for at most ``timeout`` seconds and print its result.

    ``fmt`` None: a table, cut to fit a terminal only when ``out`` is one.
    """
    from changewatch.warehouse import connect

    with connect(read_only=True) as wh:
        statement = _checked(wh, single_statement(query, wh.dialect))
        table = _fetch(wh, statement, timeout)
    _print(_frame(table), fmt or "table", out)


def _checked(wh: Warehouse, statement: str) -> str:
    """The SQL to run for ``statement``, or ``UsageError`` saying what was refused."""
    from changewatch.warehouse.read_guard import QueryRefused, QueryUnreadable, read_guard
    from changewatch.warehouse.statements import render

    rows = wh.fetch(render("select_tables_schema", wh.dialect))
    catalog, schema = rows[0][0], rows[0][1] or getattr(wh, "schema", None) or "public"
    # PostgreSQL names a table by schema; DuckDB by catalog (the attached file) and schema.
    qualifier = [schema] if wh.dialect == "postgres" else [catalog, schema]
    tables = {name.lower(): name for _, _, name in rows if name is not None}
    try:
        return read_guard(statement, dialect=wh.dialect, tables=tables, schema=qualifier)
    except QueryUnreadable as error:
        raise UsageError(str(error)) from None
    except QueryRefused as error:
        raise UsageError(f"refused: {error}") from None


def _fetch(wh: Warehouse, statement: str, timeout: float) -> pa.Table:
    """Run ``statement`` for at most ``timeout`` seconds, or ``QueryTimeout``."""
    limit = QueryTimeout(
        f"the query ran past its {timeout:g} s limit (--timeout SECONDS to change it)"
    )
    fetch = _fetch_postgres if wh.dialect == "postgres" else _fetch_duckdb
    try:
        # DuckDB runs the query in this process; either backend's result is read into it.
        with memory_cap(SQL_MEMORY):
            return fetch(wh, statement, timeout, limit)
    except QueryTimeout:
        raise
    except Exception as error:
        if isinstance(error, MemoryError) or any(w in str(error) for w in _PAST_THE_CAP):
            raise QueryTooLarge(
                f"the query needed more than {SQL_MEMORY >> 20} MiB of memory (changewatch "
                "sql's limit): select fewer rows or smaller values"
            ) from None
        raise


def _fetch_postgres(wh: Warehouse, statement: str, timeout: float, limit: Exception) -> pa.Table:
    # The server's own limit: it ends the query even if this process is killed (PostgreSQL
    # does not notice a dead client while a query runs).
    milliseconds = max(1, round(timeout * 1000))
    with wh.transaction():  # committed: the session keeps the settings
        wh.execute(f"SET statement_timeout = {milliseconds}")
        wh.execute(f"SET idle_in_transaction_session_timeout = {milliseconds}")
    try:
        return wh.fetch_batches(statement).read_all()
    except Exception as error:
        # Streamed results fail as a pyarrow OSError, without the SQLSTATE.
        if getattr(error, "sqlstate", None) == _QUERY_CANCELED or _TIMED_OUT in str(error):
            raise limit from None
        raise


def _fetch_duckdb(wh: Warehouse, statement: str, timeout: float, limit: Exception) -> pa.Table:
    # DuckDB has no statement timeout: a watchdog interrupts the statement, again and again
    # until it returns (an interrupt that lands between two steps of a statement is lost).
    # The query runs in this process, so it cannot outlive it.
    done, fired = threading.Event(), threading.Event()

    def watch() -> None:
        if done.wait(timeout):
            return
        fired.set()
        while True:
            wh.cancel()
            if done.wait(0.05):
                return

    watchdog = threading.Thread(target=watch, name="changewatch-sql-timeout", daemon=True)
    watchdog.start()
    try:
        return wh.fetch_batches(statement).read_all()
    except Exception:
        if fired.is_set():
            raise limit from None
        raise
    finally:
        done.set()
        watchdog.join()


def _print(frame: pl.DataFrame, fmt: str, out: TextIO) -> None:
    import polars as pl

    if fmt == "json":
        out.write(frame.write_json() + "\n")
        return
    if fmt == "csv":
        out.write(_flat(frame).write_csv())
        return
    if out.isatty():
        out.write(_screen(frame))
        return
    with pl.Config(**_WHOLE):
        out.write(f"{frame}\n")


def _screen(frame: pl.DataFrame) -> str:
    """``frame`` as a terminal shows it: column names and values, no shape or types; a result
    cut to fit says how much there was.

    >>> import polars as pl
    >>> print(_screen(pl.DataFrame({"n": [1, 2]})), end="")
    ┌───┐
    │ n │
    ╞═══╡
    │ 1 │
    │ 2 │
    └───┘
    """
    import polars as pl

    with pl.Config(**_SCREEN):
        text = f"{frame}\n"
    rows, columns = frame.shape
    if rows > _SCREEN["tbl_rows"] or columns > _SCREEN["tbl_cols"]:
        text += f"(cut to fit: {rows} row(s), {columns} column(s); --format csv prints all)\n"
    return text


def _flat(frame: pl.DataFrame) -> pl.DataFrame:
    """Lists and structs as JSON text: CSV cells hold scalars only."""
    import polars as pl

    nested = [name for name, dtype in frame.schema.items() if dtype.is_nested()]
    return frame.with_columns(
        pl.when(pl.col(name).is_not_null())
        .then(
            pl.struct(pl.col(name).alias("v"))
            .struct.json_encode()
            .str.strip_prefix('{"v":')
            .str.strip_suffix("}")
        )
        .alias(name)
        for name in nested
    )


def _frame(table: pa.Table) -> pl.DataFrame:
    """``table`` as a polars frame every format can print: binary values as hex text, and
    types polars cannot hold or write (intervals, unions, PostgreSQL's own types) as text.

    >>> import pyarrow as pa
    >>> _frame(pa.table({"b": [b"\\x00A", None], "n": pa.nulls(2)})).rows()
    [('0041', None), (None, None)]
    """
    import polars as pl
    import pyarrow as pa

    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if isinstance(field.type, pa.BaseExtensionType):  # PostgreSQL's json, numeric, void...
            column = pa.chunked_array(
                [chunk.storage for chunk in column.chunks], field.type.storage_type
            )
        if _needs_text(column.type):
            column = pa.array([_text(value) for value in column.to_pylist()])
        columns.append(column)
    return pl.from_arrow(pa.table(columns, names=_unique(table.column_names)), rechunk=False)


def _unique(names: list[str]) -> list[str]:
    """Column names made unique (PostgreSQL names both of ``count(*), count(x)`` "count").

    >>> _unique(["count", "n", "count", "count"])
    ['count', 'n', 'count_2', 'count_3']
    """
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return unique


def _needs_text(kind: pa.DataType) -> bool:
    import pyarrow as pa
    import pyarrow.types as t

    if isinstance(kind, pa.BaseExtensionType):
        return True
    if t.is_binary(kind) or t.is_large_binary(kind) or t.is_fixed_size_binary(kind):
        return True
    if t.is_binary_view(kind) or t.is_interval(kind) or t.is_union(kind):
        return True
    return any(_needs_text(kind.field(i).type) for i in range(kind.num_fields))


def _text(value: Any) -> Any:
    """A Python value from Arrow with bytes as hex and intervals as text, nesting kept."""
    import pyarrow as pa

    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, pa.MonthDayNano):
        months, days, nanoseconds = value
        return f"{months} months {days} days {nanoseconds / 1e9:g} seconds"
    if isinstance(value, dict):
        return {key: _text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_text(item) for item in value]
    return value
