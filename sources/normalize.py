"""Raw JSON documents -> the typed, hashed frame a source's table stores.

One columnar pass in an in-memory DuckDB: documents are split into records, every record is
parsed once against a schema built from the declared columns, values are typed, the content
hash is computed, and repeated keys are reduced to their newest version. No Python runs per
record, and the GIL is released while DuckDB works. A sync's stage, itself a DuckDB, takes the
rows where they are (``normalize_into``): they never become a frame.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
from changewatch import sql
from changewatch.sources.base import ColumnSpec, FetchResult, SourceBase
from changewatch.sources.errors import PayloadError
from changewatch.sources.limits import format_size
from changewatch.sources.rejections import Rejection, record_key

__all__ = [
    "Batch",
    "HASH_COLUMN",
    "POLARS_TYPES",
    "RAW_COLUMN",
    "RAW_HASH_COLUMN",
    "SYNCED_AT_COLUMN",
    "empty_frame",
    "finish_batches",
    "merge_fields",
    "normalize",
    "normalize_batch",
    "normalize_into",
    "normalize_with_fields",
    "parse_path",
]

RAW_COLUMN = "_raw"
# Hash of the raw payload: tells a sync whether the stored payload is still upstream's.
RAW_HASH_COLUMN = "_raw_hash"
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

# The type DuckDB's json_transform reads each declared type as (lists as one-element lists).
_JSON_TYPES: dict[str, Any] = {
    "text": "VARCHAR",
    "bigint": "BIGINT",
    "integer": "INTEGER",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "timestamp": "TIMESTAMPTZ",
    "json": "JSON",
    "text[]": ["VARCHAR"],
    "bigint[]": ["BIGINT"],
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


def normalize(
    fetched: FetchResult, config: SourceBase, *, synced_at: datetime, first_document: int = 0
) -> pl.DataFrame:
    """The typed frame of one fetch (see ``normalize_with_fields``)."""
    return normalize_with_fields(
        fetched, config, synced_at=synced_at, first_document=first_document
    )[0]


def normalize_with_fields(
    fetched: FetchResult,
    config: SourceBase,
    *,
    synced_at: datetime,
    first_document: int = 0,
    known_fields: Collection[str] | None = None,
) -> tuple[pl.DataFrame, dict[str, str | None]]:
    """Typed frame of one fetch: declared columns, then ``_content_hash``, ``_synced_at``, ``_raw``.

    One row per primary key: when an object came more than once (it moved between pages, or
    changed while the walk went on) its newest version by updated-at, then arrival, wins.
    Raises ``PayloadError`` naming the source and record when a document is not JSON, a value
    cannot take its declared type, or a primary key is missing. ``first_document`` numbers
    the documents of a batch within the whole fetch, for error messages.

    Also returns the top-level fields the records carry, for schema drift: each field not in
    ``known_fields`` comes with the changewatch type of its values (``text``, ``bigint``,
    ``double``, ``boolean`` or ``json``), the known ones with None. Without ``known_fields``
    (a source's first sync: its baseline schema) no types are worked out.
    """
    if not fetched.documents:
        return empty_frame(config), {}
    batch = normalize_batch(
        fetched.documents,
        fetched.records_path,
        config,
        first_document=first_document,
        known_fields=known_fields,
    )
    return finish_batches([batch], config, synced_at=synced_at)


@dataclass(frozen=True)
class Batch:
    """Some documents of a fetch, typed and hashed: one row per record, keys not yet unique."""

    frame: pl.DataFrame
    # Top-level field -> DuckDB JSON type of its first non-null value here ("NULL": only
    # nulls here; None: a known field, not worked out).
    fields: dict[str, str | None]


def normalize_batch(
    documents: Sequence[bytes],
    records_path: str | None,
    config: SourceBase,
    *,
    first_document: int = 0,
    known_fields: Collection[str] | None = None,
    connection: duckdb.DuckDBPyConnection | None = None,
) -> Batch:
    """One columnar DuckDB pass over ``documents`` (see ``normalize_with_fields``).

    Batches of one fetch may run while the walk goes on (``sources.stream``), reusing one
    in-memory ``connection`` (opening one costs more than a small batch); raises
    ``PayloadError`` for the first bad record of the batch.
    """
    if connection is None:
        with duckdb.connect() as con:
            return normalize_batch(
                documents,
                records_path,
                config,
                first_document=first_document,
                known_fields=known_fields,
                connection=con,
            )
    con = connection
    with _records(con, documents, records_path, config, first_document=first_document):
        try:
            typed = _typed(con, config)
            fields = _payload_fields(con, known_fields)
        except duckdb.Error as error:
            raise _locate_bad_document(con, config, error) from None
    if problem := _bad_record(typed, config):
        raise problem
    return Batch(typed, fields)


def normalize_into(
    write: Callable[[str], None],
    documents: Sequence[bytes],
    records_path: str | None,
    config: SourceBase,
    *,
    connection: duckdb.DuckDBPyConnection,
    first_document: int = 0,
    known_fields: Collection[str] | None = None,
    reject: Callable[[list[Rejection]], None] | None = None,
) -> dict[str, str | None]:
    """``normalize_batch`` for rows that stay in DuckDB: returns the batch's payload fields.

    ``write`` takes the query of the batch's normalized rows (``normalize_batch``'s columns
    but ``_bad_value``) and runs it on ``connection``, say into a table. A bad record aborts
    the query, so nothing of the batch is written; the ``PayloadError`` raised then is the
    one ``normalize_batch`` raises. With ``reject`` (a ``skip`` source), the batch is written
    again without its bad records, which go to ``reject`` instead.
    """
    con = connection
    with _records(con, documents, records_path, config, first_document=first_document):
        try:
            write(_checked_statement(config))
            return _payload_fields(con, known_fields)
        except duckdb.Error as error:
            failed = error
        # Rare, so the slow way: the frame normalize_batch makes tells which record is bad,
        # in the same words. When none is, the write itself failed.
        try:
            typed = _typed(con, config)
        except duckdb.Error as error:
            raise _locate_bad_document(con, config, error) from None
        problem = _bad_record(typed, config)
        if problem is None:
            raise failed
        if reject is None:
            raise problem from None
        write(_good_statement(config))
        reject(_rejections(typed, config))
        return _payload_fields(con, known_fields)


@contextmanager
def _records(
    con: duckdb.DuckDBPyConnection,
    documents: Sequence[bytes],
    records_path: str | None,
    config: SourceBase,
    *,
    first_document: int,
) -> Iterator[None]:
    """Tables ``documents`` and ``records`` (one row per record) for the block."""
    try:
        # Checks every document is UTF-8. The system allocator gives each batch's 4 MiB back
        # at once; pyarrow's default pool kept them, 27 MiB more at the peak of a million rows.
        texts = pa.array(documents, pa.string(), memory_pool=pa.system_memory_pool())
    except pa.ArrowInvalid:
        raise _not_text(documents, config, first_document) from None
    indexes = pa.array(range(first_document, first_document + len(documents)), pa.int64())
    con.register("documents", pa.table({"doc_index": indexes, "doc": texts}))
    try:
        try:
            # One call for both (the worker waits for the GIL after each): timestamps leave
            # DuckDB in UTC whatever the machine's zone, and the hash depends on it.
            con.execute(
                "SET TimeZone = 'UTC'; "
                + sql.load("create_records_documents").format(
                    records=_records_expr(records_path), record=_record_expr(config)
                )
            )
        except duckdb.Error as error:
            raise _locate_bad_document(con, config, error) from None
        yield
    finally:
        con.execute("DROP TABLE IF EXISTS records")
        con.unregister("documents")


def _typed(con: duckdb.DuckDBPyConnection, config: SourceBase) -> pl.DataFrame:
    """The normalized rows of ``records``, ``_bad_value`` included."""
    typed = pl.from_arrow(con.sql(_statement(config)).to_arrow_table())
    assert isinstance(typed, pl.DataFrame)
    return typed


def _payload_fields(
    con: duckdb.DuckDBPyConnection, known_fields: Collection[str] | None
) -> dict[str, str | None]:
    """The top-level fields of ``records``; those not in ``known_fields`` with their type."""
    fields: dict[str, str | None] = {
        field: None for (field,) in con.execute(sql.load("select_fields_records")).fetchall()
    }
    for field in fields.keys() - set(known_fields or fields):
        path = "$." + json.dumps(field)
        found = con.execute(sql.load("select_field_type_records"), [path]).fetchall()
        fields[field] = found[0][0] if found else "NULL"
    return fields


def finish_batches(
    batches: Sequence[Batch], config: SourceBase, *, synced_at: datetime
) -> tuple[pl.DataFrame, dict[str, str | None]]:
    """The batches of one fetch as one frame, newest version per key, and the fields seen."""
    if not batches:
        return empty_frame(config), {}
    frame = pl.concat([batch.frame for batch in batches], how="vertical").sort("_arrival")
    frame = _newest_per_key(frame, config)
    schema = {name: POLARS_TYPES[spec.type] for name, spec in config.columns.items()}
    frame = frame.select(
        *(pl.col(name).cast(dtype) for name, dtype in schema.items()),
        HASH_COLUMN,
        pl.lit(synced_at).cast(UTC_MICROS).alias(SYNCED_AT_COLUMN),
        RAW_COLUMN,
    )
    return frame, merge_fields([batch.fields for batch in batches])


def merge_fields(found: Sequence[dict[str, str | None]]) -> dict[str, str | None]:
    """The payload fields of a fetch's batches (in order), each with its changewatch type.

    A new field's type is that of its first non-null value over the whole fetch.

    >>> merge_fields([{"id": None, "score": "NULL"}, {"score": "BIGINT", "tags": "ARRAY"}])
    {'id': None, 'score': 'bigint', 'tags': 'json'}
    """
    fields: dict[str, str | None] = {}
    for batch in found:
        for field, kind in batch.items():
            if fields.get(field, "NULL") == "NULL":
                fields[field] = kind
    return {f: None if t is None else _FIELD_TYPES.get(t, "json") for f, t in fields.items()}


def _newest_per_key(frame: pl.DataFrame, config: SourceBase) -> pl.DataFrame:
    # An object seen twice in one walk (it moved between pages, or changed while the walk
    # went on) keeps its newest version by updated-at, then arrival: each key is written once.
    keys = config.primary_key
    if not frame.select(pl.struct(keys).is_duplicated().any()).item():
        return frame
    order = [config.updated_at, "_arrival"] if config.updated_at else ["_arrival"]
    return frame.sort(order, nulls_last=False).unique(keys, keep="last").sort("_arrival")


def empty_frame(config: SourceBase) -> pl.DataFrame:
    """A zero-row frame with the normalized schema of ``config``."""
    schema = {name: POLARS_TYPES[spec.type] for name, spec in config.columns.items()}
    schema |= {HASH_COLUMN: pl.String(), SYNCED_AT_COLUMN: UTC_MICROS, RAW_COLUMN: pl.String()}
    return pl.DataFrame(schema=schema)


# JSON types DuckDB reports -> the changewatch column type a drifted field gets.
_FIELD_TYPES = {
    "VARCHAR": "text",
    "BIGINT": "bigint",
    "UBIGINT": "bigint",
    "DOUBLE": "double",
    "BOOLEAN": "boolean",
    "ARRAY": "json",
    "OBJECT": "json",
    "NULL": "text",
}


def _records_expr(records_path: str | None) -> str:
    if records_path:
        return f"json_extract(doc, {_literal(_dotted_json_path(records_path))})"
    return "doc"


def _record_expr(config: SourceBase) -> str:
    """Each record as stored: a fleet target's carries its target (the key includes it).

    Stamped here, in the one columnar pass, rather than record by record as pages arrive;
    a value upstream sent under the target column's name is replaced, and a record that is
    no object is left for the checks that name it.
    """
    scope = config.target_scope
    if scope is None:
        return "raw"
    stamp = _literal(json.dumps({scope.column: scope.value}))
    return f"CASE WHEN json_type(raw) = 'OBJECT' THEN json_merge_patch(raw, {stamp}) ELSE raw END"


def _statement(config: SourceBase) -> str:
    """The normalization query for one source (see ``sql/select_normalized_records.sql``)."""
    # Numbers and booleans are read as text, then cast here, so each value can be checked
    # against its text (see _EXACT) without parsing the record twice.
    exact = {
        name
        for name, spec in config.columns.items()
        if spec.type in _EXACT and (spec.type == "bigint[]" or "[]" not in (spec.path or ""))
    }
    tree: dict[str, Any] = {}
    for name, spec in config.columns.items():
        if name in exact:
            as_text = "text[]" if spec.type == "bigint[]" else "text"
            spec = spec.model_copy(update={"type": as_text})
        _merge(tree, _steps(name, spec), _leaf_type(spec))
    column_exprs = []
    checks = []
    for index, (name, spec) in enumerate(config.columns.items()):
        expr = _column_expr(_steps(name, spec))
        if name in exact:
            text = f"_text{index}"
            column_exprs.append(
                f"TRY_CAST({expr} AS {_CASTS[spec.type]}) AS {_q(name)}, {expr} AS {text}"
            )
            rule = _EXACT[spec.type].format(value=_q(name), text=text)
            checks.append(f"WHEN {text} IS NOT NULL AND NOT COALESCE({rule}, FALSE)")
        else:
            column_exprs.append(f"{expr} AS {_q(name)}")
            # Text and JSON take any value; a `[]` path has no single value to check.
            if spec.type in ("text", "json") or "[]" in (spec.path or ""):
                continue
            path = _literal(_json_path(name, spec))
            checks.append(f"WHEN {_q(name)} IS NULL AND json_type(raw, {path}) NOT IN ('NULL')")
        checks[-1] += f" THEN {_literal(name)}"
    return sql.load("select_normalized_records").format(
        schema=_literal(json.dumps(tree)),
        column_exprs=", ".join(column_exprs),
        columns=", ".join(_q(name) for name in config.columns),
        # Sorted keys: reordering columns in config must not change any hash.
        hash_fields=", ".join(f"{_q(name)} := {_q(name)}" for name in sorted(config.columns)),
        bad_value=f"CASE {' '.join(checks)} END" if checks else "NULL",
    )


def _checked_statement(config: SourceBase) -> str:
    """The normalization query of rows that stay in DuckDB: a bad record aborts it."""
    return sql.load("select_checked_records").format(
        normalized=_statement(config),
        has_key=" AND ".join(f"{_q(key)} IS NOT NULL" for key in config.primary_key),
    )


def _good_statement(config: SourceBase) -> str:
    """The normalization query of a ``skip`` source's batch that holds bad records: the others."""
    return sql.load("select_good_records").format(
        normalized=_statement(config),
        has_key=" AND ".join(f"{_q(key)} IS NOT NULL" for key in config.primary_key),
    )


# When a value typed from its JSON ``text`` (numbers as written, strings unquoted) is exactly
# that value; json_transform alone would round 3.7 into an integer and read 1 as true. Whole
# numbers only for integers: 4, 4.0, 1e3 and "7" fit, 3.7 and "3.7" do not (never rounded),
# nor true. Doubles take numbers and numeric strings, never booleans. Booleans take true and
# false (or "true" and "false"), not 0, 1 or "yes". Each element of a bigint[] is a bigint.
# Timestamps take any text DuckDB reads as one (ISO 8601, with an offset or a zone name), not
# numbers or booleans. Anything else is a record error. Reading timestamps as text also spares
# a second parse of the record to tell a JSON null from an unreadable value (about a tenth of
# normalization's time on the demo API).
_WHOLE = (
    "(CAST({value} AS VARCHAR) = {text} OR TRY_CAST({text} AS DOUBLE) = CAST({value} AS DOUBLE))"
)
_EXACT = {
    "integer": _WHOLE,
    "bigint": _WHOLE,
    "double": "{value} IS NOT NULL AND {text} NOT IN ('true', 'false')",
    "boolean": "{text} IN ('true', 'false')",
    "timestamp": "{value} IS NOT NULL",
    # Element by element (a null element stays null); an empty list is exact.
    "bigint[]": "COALESCE(list_bool_and(list_transform({text}, lambda _e, _i: _e IS NULL OR "
    + "COALESCE("
    + _WHOLE.format(value="{value}[_i]", text="_e")
    + ", FALSE))), TRUE)",
}
_CASTS = {
    "integer": "INTEGER",
    "bigint": "BIGINT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "timestamp": "TIMESTAMPTZ",
    "bigint[]": "BIGINT[]",
}


def _steps(name: str, spec: ColumnSpec) -> tuple[_Step, ...]:
    return parse_path(spec.path or name)


def _leaf_type(spec: ColumnSpec) -> Any:
    # A `[]` path already makes the result a list, so its leaf is the element type.
    kind = _JSON_TYPES[spec.type]
    if isinstance(kind, list) and "[]" in (spec.path or ""):
        return kind[0]
    return kind


def _merge(tree: dict[str, Any], steps: Sequence[_Step], leaf: Any) -> None:
    """Add one path to the nested json_transform structure."""
    head, rest = steps[0], steps[1:]
    if not rest:
        tree[head.field] = [leaf] if head.each and not isinstance(leaf, list) else leaf
        return
    if head.each:
        holder = tree.setdefault(head.field, [{}])
        if not (isinstance(holder, list) and isinstance(holder[0], dict)):
            raise ValueError(f"field {head.field!r} is used both as a value and as a list")
        _merge(holder[0], rest, leaf)
        return
    sub = tree.setdefault(head.field, {})
    if not isinstance(sub, dict):
        raise ValueError(f"field {head.field!r} is used both as a value and as an object")
    _merge(sub, rest, leaf)


def _column_expr(steps: Sequence[_Step], base: str = "d") -> str:
    """Navigate the transformed struct along a path; `[]` steps map over list elements."""
    expr = base
    for index, step in enumerate(steps):
        expr = f"{expr}.{_q(step.field)}"
        rest = steps[index + 1 :]
        if step.each and rest:
            var = f"x{index}"
            return f"list_transform({expr}, lambda {var}: {_column_expr(rest, var)})"
    return expr


def _json_path(name: str, spec: ColumnSpec) -> str:
    return "$" + "".join(f'."{step.field}"' for step in _steps(name, spec))


def _dotted_json_path(path: str) -> str:
    """JSON path of a dotted records path.

    >>> _dotted_json_path("data.items")
    '$."data"."items"'
    """
    return "$" + "".join(f'."{part}"' for part in path.split("."))


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _bad_record(frame: pl.DataFrame, config: SourceBase) -> PayloadError | None:
    """The error naming the first record with a bad value, else the first with no key."""
    bad = frame.filter(pl.col("_bad_value").is_not_null())
    if bad.height:
        row = bad.sort("_arrival").row(0, named=True)
        column = row["_bad_value"]
        value = _value_at(row[RAW_COLUMN], _steps(column, config.columns[column]))
        key = {
            k: _value_at(row[RAW_COLUMN], _steps(k, config.columns[k])) for k in config.primary_key
        }
        return PayloadError(
            f"source {config.name!r}: {_where(row['_arrival'])} (key {key}): field "
            f"{column!r} value {value!r} is not {_a(config.columns[column].type)} (values are "
            f"never rounded or coerced: fix the data or declare another type; "
            f"{bad.height} such records)"
        )
    missing = frame.filter(pl.any_horizontal(pl.col(config.primary_key).is_null()))
    if missing.height:
        row = missing.sort("_arrival").row(0, named=True)
        return PayloadError(
            f"source {config.name!r}: {_where(row['_arrival'])} has no primary key "
            f"{config.primary_key} ({missing.height} such records)"
        )
    return None


def _rejections(frame: pl.DataFrame, config: SourceBase) -> list[Rejection]:
    """A ``Rejection`` for each record of ``frame`` with a bad value or no primary key, in
    the words ``_bad_record`` uses. A null in a records list is no record, and not rejected:
    ``values.drop_oversized`` leaves one where it took a record out."""
    found = []
    keys = pl.any_horizontal(pl.col(config.primary_key).is_null())
    bad = (pl.col("_bad_value").is_not_null() | keys) & (pl.col(RAW_COLUMN) != "null")
    for row in frame.filter(bad).iter_rows(named=True):
        key = {
            k: _value_at(row[RAW_COLUMN], _steps(k, config.columns[k])) for k in config.primary_key
        }
        column = row["_bad_value"]
        if column is not None:
            value = _value_at(row[RAW_COLUMN], _steps(column, config.columns[column]))
            shown = repr(value)
            shown = shown if len(shown) <= 200 else shown[:200] + "..."
            reason = f"value {shown} is not {_a(config.columns[column].type)}"
        else:
            column = ", ".join(k for k in config.primary_key if row[k] is None)
            reason = f"no primary key {config.primary_key}"
        found.append(Rejection(record_key(key, _where(row["_arrival"])), column, reason))
    return found


def _a(column_type: str) -> str:
    """The type with its article, for messages.

    >>> _a("integer"), _a("bigint")
    ('an integer', 'a bigint')
    """
    return ("an " if column_type[0] in "aeiou" else "a ") + column_type


def _where(arrival: int) -> str:
    page, position = divmod(arrival, 1_000_000_000)
    return f"document {page + 1} record #{position}"


def _value_at(raw: Any, steps: Sequence[_Step]) -> Any:
    value: Any = json.loads(raw) if isinstance(raw, str) else raw
    for index, step in enumerate(steps):
        value = value.get(step.field) if isinstance(value, dict) else None
        if step.each and index + 1 < len(steps) and isinstance(value, list):
            return [_value_at(item, steps[index + 1 :]) for item in value]
    return value


def _out_of_memory(
    con: duckdb.DuckDBPyConnection, config: SourceBase, error: duckdb.Error
) -> PayloadError:
    """No record's fault: which documents, how large the largest, and what to change."""
    first, last, largest = con.sql(
        "SELECT min(doc_index) + 1, max(doc_index) + 1, max(strlen(doc)) FROM documents"
    ).fetchall()[0]
    which = f"document {first}" if first == last else f"documents {first}-{last}"
    return PayloadError(
        f"source {config.name!r}: out of memory normalizing {which} (the largest is "
        f"{format_size(largest)}): {str(error).splitlines()[0]}; lower the source's "
        f"max_value_bytes ({format_size(config.max_value_bytes)}) to refuse such values"
    )


def _not_text(documents: Sequence[bytes], config: SourceBase, first: int) -> PayloadError:
    """The error naming the first of ``documents`` that is not UTF-8 text."""
    for index, document in enumerate(documents):
        try:
            document.decode()
        except UnicodeDecodeError as error:
            return PayloadError(
                f"source {config.name!r}: document {first + index + 1} is not JSON "
                f"(not UTF-8 text: {error.reason} at byte {error.start})"
            )
    return PayloadError(f"source {config.name!r}: a document is not UTF-8 text")


def _locate_bad_document(
    con: duckdb.DuckDBPyConnection, config: SourceBase, error: duckdb.Error
) -> PayloadError:
    if isinstance(error, duckdb.OutOfMemoryException):
        return _out_of_memory(con, config, error)
    found = con.sql(
        "SELECT doc_index FROM documents WHERE NOT json_valid(doc) ORDER BY doc_index LIMIT 1"
    ).fetchall()
    if found:
        return PayloadError(f"source {config.name!r}: document {found[0][0] + 1} is not JSON")
    detail = str(error).splitlines()[0]
    return PayloadError(
        f"source {config.name!r}: records do not fit the declared columns: {detail}"
    )
