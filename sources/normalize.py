"""Raw records -> the typed, hashed frame a source's table stores.

Decoding is columnar: every record becomes one JSON string, and polars decodes the whole
column at once against a schema built from the declared columns, so only declared fields are
parsed and every value arrives with its declared type.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb
import orjson
import polars as pl

from sources.base import ColumnSpec, SourceBase
from sources.errors import PayloadError

__all__ = [
    "HASH_COLUMN",
    "RAW_COLUMN",
    "SYNCED_AT_COLUMN",
    "POLARS_TYPES",
    "content_hash",
    "normalize",
    "parse_path",
]

RAW_COLUMN = "_raw"
HASH_COLUMN = "_content_hash"
SYNCED_AT_COLUMN = "_synced_at"

UTC_MICROS = pl.Datetime("us", "UTC")

POLARS_TYPES: dict[str, pl.DataType] = {
    "text": pl.String(),
    "bigint": pl.Int64(),
    "integer": pl.Int32(),
    "double": pl.Float64(),
    "boolean": pl.Boolean(),
    "timestamp": UTC_MICROS,
    "json": pl.String(),
    "text[]": pl.List(pl.String()),
    "bigint[]": pl.List(pl.Int64()),
}

# How each declared type is decoded from JSON; timestamps arrive as text and are parsed after.
_DECODE_TYPES: dict[str, pl.DataType] = {
    **POLARS_TYPES,
    "timestamp": pl.String(),
    "text[]": pl.List(pl.String()),
}

_STEP = re.compile(r"^([A-Za-z0-9_$@\-]+)(\[\])?$")


@dataclass(frozen=True)
class _Step:
    field: str
    each: bool  # the field holds a list; the rest of the path applies to every element


def parse_path(path: str) -> tuple[_Step, ...]:
    """Split a column path into steps.

    >>> [(s.field, s.each) for s in parse_path("labels[].name")]
    [('labels', True), ('name', False)]
    >>> [(s.field, s.each) for s in parse_path("assignee.login")]
    [('assignee', False), ('login', False)]
    """
    steps = []
    for part in path.split("."):
        match = _STEP.match(part)
        if not match:
            raise ValueError(f"bad path {path!r}: segment {part!r} is not a field name")
        steps.append(_Step(match.group(1), bool(match.group(2))))
    return tuple(steps)


def _steps(name: str, spec: ColumnSpec) -> tuple[_Step, ...]:
    return parse_path(spec.path or name)


def _merge_dtype(tree: dict[str, Any], steps: Sequence[_Step], leaf: pl.DataType) -> None:
    """Add one path to a nested {field: subtree | dtype} tree describing the decode schema."""
    head, rest = steps[0], steps[1:]
    if not rest:
        tree[head.field] = pl.List(leaf) if head.each and not isinstance(leaf, pl.List) else leaf
        return
    sub = tree.setdefault(head.field, {"__each__": head.each})
    if not isinstance(sub, dict):
        raise ValueError(f"field {head.field!r} is used both as a value and as an object")
    _merge_dtype(sub, rest, leaf)


def _tree_to_dtype(tree: dict[str, Any]) -> pl.Struct:
    fields = {}
    for key, sub in tree.items():
        if key == "__each__":
            continue
        if isinstance(sub, dict):
            inner = _tree_to_dtype(sub)
            fields[key] = pl.List(inner) if sub["__each__"] else inner
        else:
            fields[key] = sub
    return pl.Struct(fields)


def _column_expr(source: pl.Expr, steps: Sequence[_Step]) -> pl.Expr:
    """Navigate a decoded struct column along a path; `[]` steps map over list elements."""
    expr = source
    for index, step in enumerate(steps):
        expr = expr.struct.field(step.field)
        rest = steps[index + 1 :]
        if step.each and rest:
            return expr.list.eval(_column_expr(pl.element(), rest))
    return expr


def _leaf_type(spec: ColumnSpec) -> pl.DataType:
    # A `[]` path already makes the result a list, so its leaf is the element type.
    if spec.type.endswith("[]") and spec.path and "[]" in spec.path:
        return _DECODE_TYPES[spec.type].inner  # type: ignore[attr-defined]
    return _DECODE_TYPES[spec.type]


def _json_value(record: Any, steps: Sequence[_Step]) -> Any:
    for step in steps:
        if not isinstance(record, dict):
            return None
        record = record.get(step.field)
    return record


def normalize(
    records: list[dict[str, Any]], config: SourceBase, *, synced_at: datetime
) -> pl.DataFrame:
    """Typed frame of one source's records: declared columns, raw payload, hash, synced-at.

    Takes the raw records of one fetch (arrival order) and returns one row per primary key
    (the latest by updated-at, then by arrival, when an object came twice), with columns in
    declared order followed by ``_content_hash``, ``_synced_at`` and ``_raw`` (JSON text).
    Raises ``PayloadError`` naming the source and record when a value cannot take its type
    or a primary key is missing.
    """
    columns = config.columns
    if not records:
        return empty_frame(config)
    raw = pl.Series(RAW_COLUMN, [orjson.dumps(r).decode() for r in records], dtype=pl.String)

    tree: dict[str, Any] = {}
    json_columns = {}
    for name, spec in columns.items():
        if spec.type == "json":
            json_columns[name] = _steps(name, spec)
        else:
            _merge_dtype(tree, _steps(name, spec), _leaf_type(spec))
    try:
        decoded = raw.str.json_decode(_tree_to_dtype(tree)) if tree else None
    except pl.exceptions.PolarsError as error:
        raise _locate_payload_error(records, config, tree) from error

    exprs = []
    for name, spec in columns.items():
        if spec.type == "json":
            # Sub-documents stay JSON text with sorted keys, so key order upstream is not a
            # change; rare enough that a per-record dump is fine.
            values = [
                None
                if (v := _json_value(r, json_columns[name])) is None
                else orjson.dumps(v, option=orjson.OPT_SORT_KEYS)
                for r in records
            ]
            exprs.append(pl.Series(name, values, dtype=pl.Binary).cast(pl.String).alias(name))
            continue
        expr = _column_expr(pl.col("decoded"), _steps(name, spec))
        # Timestamps stay text here and are parsed below, where bad text can be reported.
        exprs.append(expr.cast(_DECODE_TYPES[spec.type]).alias(name))

    frame = pl.DataFrame({"decoded": decoded}) if decoded is not None else pl.DataFrame()
    frame = frame.with_columns(raw, pl.int_range(pl.len()).alias("_arrival"))
    frame = _parse_timestamps(frame.select(*exprs, RAW_COLUMN, "_arrival"), config)
    _check_keys(frame, config)

    # The same object can appear twice in one walk (it moved between pages, or changed while
    # we paged): keep its newest version so each key is written once.
    order = [config.updated_at, "_arrival"] if config.updated_at else ["_arrival"]
    frame = frame.sort(order, nulls_last=False).unique(config.primary_key, keep="last")
    frame = frame.sort("_arrival").drop("_arrival")
    return frame.with_columns(
        content_hash(frame, list(columns)).alias(HASH_COLUMN),
        pl.lit(synced_at).cast(UTC_MICROS).alias(SYNCED_AT_COLUMN),
    ).select(*columns, HASH_COLUMN, SYNCED_AT_COLUMN, RAW_COLUMN)


def empty_frame(config: SourceBase) -> pl.DataFrame:
    """A zero-row frame with the normalized schema of ``config``."""
    schema = {name: POLARS_TYPES[spec.type] for name, spec in config.columns.items()}
    schema |= {HASH_COLUMN: pl.String(), SYNCED_AT_COLUMN: UTC_MICROS, RAW_COLUMN: pl.String()}
    return pl.DataFrame(schema=schema)


def content_hash(frame: pl.DataFrame, columns: list[str]) -> pl.Series:
    """SHA-256 (hex) of each row's normalized fields: the one definition of "content".

    The fields are encoded as one JSON object with keys in sorted order, so reordering columns
    in config does not change any hash; fields that are not declared (new upstream fields,
    the raw payload, sync bookkeeping) are not part of it.
    """
    canonical = frame.select(pl.struct(sorted(columns)).struct.json_encode().alias("doc"))
    # DuckDB hashes the whole column in native code; polars has no stable cryptographic hash.
    with duckdb.connect() as con:
        con.register("canonical", canonical.to_arrow())
        hashed = con.sql("SELECT sha256(doc) AS h FROM canonical").to_arrow_table()
    return pl.Series(HASH_COLUMN, hashed.column("h").to_pylist(), dtype=pl.String)


def _check_keys(frame: pl.DataFrame, config: SourceBase) -> None:
    missing = frame.filter(pl.any_horizontal(pl.col(config.primary_key).is_null()))
    if missing.height:
        index = missing.get_column("_arrival")[0]
        raise PayloadError(
            f"source {config.name!r}: record #{index} has no primary key "
            f"{config.primary_key} ({missing.height} such records)"
        )


def _parse_timestamps(frame: pl.DataFrame, config: SourceBase) -> pl.DataFrame:
    """Parse ISO-8601 text columns; text that does not parse fails loudly, never becomes NULL."""
    names = [name for name, spec in config.columns.items() if spec.type == "timestamp"]
    if not names:
        return frame
    parsed = frame.with_columns(
        pl.col(name)
        .str.to_datetime(time_zone="UTC", time_unit="us", strict=False)
        .alias(f"_parsed_{name}")
        for name in names
    )
    for name in names:
        bad = parsed.filter(pl.col(f"_parsed_{name}").is_null() & pl.col(name).is_not_null())
        if bad.height:
            row = bad.row(0, named=True)
            raise PayloadError(
                f"source {config.name!r}: record #{row['_arrival']} field {name!r} "
                f"value {row[name]!r} is not an ISO-8601 timestamp"
            )
    return parsed.with_columns(pl.col(f"_parsed_{n}").alias(n) for n in names).drop(
        f"_parsed_{n}" for n in names
    )


def _locate_payload_error(
    records: list[dict[str, Any]], config: SourceBase, tree: dict[str, Any]
) -> PayloadError:
    """Find the first record the columnar decode choked on, to name it in the error."""
    dtype = _tree_to_dtype(tree)
    for index, record in enumerate(records):
        try:
            pl.Series([orjson.dumps(record).decode()]).str.json_decode(dtype)
        except pl.exceptions.PolarsError as error:
            key = {k: _json_value(record, _steps(k, config.columns[k])) for k in config.primary_key}
            detail = str(error).splitlines()[0]
            return PayloadError(
                f"source {config.name!r}: record #{index} (key {key}) does not match the "
                f"declared columns: {detail}"
            )
    return PayloadError(f"source {config.name!r}: records do not match the declared columns")
