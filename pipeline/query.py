"""`changewatch sql`: one statement on a read-only connection, shown as a table, CSV or JSON."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from changewatch.pipeline.errors import UsageError

if TYPE_CHECKING:
    import polars as pl

__all__ = ["FORMATS", "run_query", "single_statement"]

FORMATS = ("table", "csv", "json")


def single_statement(query: str, dialect: str) -> str:
    """``query`` without a trailing ``;``; ``UsageError`` unless it is exactly one statement.

    Split with sqlglot's tokenizer, so a ``;`` inside a string or comment does not count.

    >>> single_statement("SELECT ';' AS s;", "duckdb")
    "SELECT ';' AS s"
    >>> single_statement("SELECT 1; DROP TABLE sync_runs", "postgres")
    Traceback (most recent call last):
    ...
    changewatch.pipeline.errors.UsageError: the query holds 2 statements; give exactly one
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


def run_query(query: str, *, fmt: str | None, out: TextIO = sys.stdout) -> None:
    """Run ``query`` on a read-only connection to the warehouse and print its result.

    ``fmt`` None: a table, cut to fit a terminal only when ``out`` is one.
    """
    from changewatch.warehouse import connect

    with connect(read_only=True) as wh:
        statement = single_statement(query, wh.dialect)
        frame = wh.fetch_frame(statement)
    _print(frame, fmt or "table", out)


def _print(frame: pl.DataFrame, fmt: str, out: TextIO) -> None:
    import polars as pl

    if fmt == "json":
        out.write(frame.write_json() + "\n")
        return
    if fmt == "csv":
        out.write(_flat(frame).write_csv())
        return
    if out.isatty():
        limits = {"tbl_rows": 50, "tbl_cols": 20, "fmt_str_lengths": 40, "tbl_width_chars": 160}
    else:  # piped or redirected: every row, column and character
        limits = {
            "tbl_rows": -1,
            "tbl_cols": -1,
            "fmt_str_lengths": 1_000_000,
            "fmt_table_cell_list_len": -1,
            "tbl_width_chars": 65_535,  # polars' widest
        }
    with pl.Config(**limits):
        out.write(f"{frame}\n")


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
