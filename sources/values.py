"""Values over a source's ``max_value_bytes``, found in a document before it is normalized.

Only a document larger than the limit can hold a value larger than it, so ordinary pages
never come here: the streaming normalizer (``sources.stream``) asks about the rare large
document, and a value over the limit fails the sync with one line naming the source, the
record's key and the field, before DuckDB spends some 20-35 times the document's size on it.
A ``skip`` source's document loses those records instead (``drop_oversized``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from changewatch.sources.base import SourceBase
from changewatch.sources.errors import PayloadError
from changewatch.sources.limits import format_size
from changewatch.sources.normalize import parse_path
from changewatch.sources.rejections import Rejection, record_key

__all__ = ["check_value_sizes", "drop_oversized"]


def check_value_sizes(document: bytes, records_path: str | None, config: SourceBase) -> None:
    """Raise ``PayloadError`` for the first record of ``document`` with a value over
    ``config.max_value_bytes``; return when there is none (or the document is no JSON list
    of records: normalization reports that in its own words)."""
    for _, record, path, size in _oversized_records(document, records_path, config):
        raise PayloadError(
            f"source {config.name!r}: record {_key(record, config)}: field {path!r} "
            f"is {format_size(size)}, {_over(config)}; raise it in watches.yaml"
        )


def drop_oversized(
    document: bytes, records_path: str | None, config: SourceBase, *, number: int = 1
) -> tuple[bytes, list[Rejection]]:
    """``document`` (the fetch's ``number``th) without its records that hold a value over
    ``config.max_value_bytes``, and a ``Rejection`` for each; ``document`` itself when there
    is none."""
    found = list(_oversized_records(document, records_path, config))
    if not found:
        return document, []
    # Parsed again, only for this rare document: the first pass stopped at each record found.
    parsed: Any = orjson.loads(document)
    holder, step = _holder(parsed, records_path)
    dropped = {index for index, *_ in found}
    # A null in its place, so the records after it keep their numbers (a record without a key
    # is named by its place); a skipping normalizer leaves nulls out (normalize._rejections).
    kept = [None if index in dropped else r for index, r in enumerate(_at(holder, step))]
    if step is None:
        parsed = kept
    else:
        holder[step] = kept
    rejections = [
        Rejection(
            record_key(_key(record, config), f"document {number} record #{index}"),
            path,
            f"value is {format_size(size)}, {_over(config)}",
        )
        for index, record, path, size in found
    ]
    return orjson.dumps(parsed), rejections


def _over(config: SourceBase) -> str:
    return f"over max_value_bytes ({format_size(config.max_value_bytes)})"


def _oversized_records(
    document: bytes, records_path: str | None, config: SourceBase
) -> Iterator[tuple[int, dict[str, Any], str, int]]:
    """Each record of ``document`` with a value over the limit: its place in the list, the
    record, the path of its largest such value and that value's size."""
    limit = config.max_value_bytes
    if len(document) <= limit:
        return  # no value can be larger than the document holding it
    try:
        records: Any = orjson.loads(document)
    except orjson.JSONDecodeError:
        return
    holder, step = _holder(records, records_path)
    records = _at(holder, step)
    if not isinstance(records, list):
        return
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            continue
        for name, value in record.items():
            found = _oversized(name, value, limit)
            if found is not None:
                yield index, record, *found
                break


def _holder(parsed: Any, records_path: str | None) -> tuple[Any, str | None]:
    """The object holding the records list and its field (None: the document is the list)."""
    steps = records_path.split(".") if records_path else []
    for step in steps[:-1]:
        parsed = parsed.get(step) if isinstance(parsed, dict) else None
    return parsed, (steps[-1] if steps else None)


def _at(holder: Any, step: str | None) -> Any:
    if step is None:
        return holder
    return holder.get(step) if isinstance(holder, dict) else None


def _oversized(path: str, value: Any, limit: int) -> tuple[str, int] | None:
    """The deepest path under ``path`` whose value is over ``limit`` bytes, and its size."""
    size = _size(value)
    if size <= limit:
        return None
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for name, child in children:
        found = _oversized(
            f"{path}[{name}]" if isinstance(name, int) else f"{path}.{name}", child, limit
        )
        if found is not None:
            return found
    return path, size


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    return len(orjson.dumps(value))


def _key(record: dict[str, Any], config: SourceBase) -> dict[str, Any]:
    """The record's primary key, as the other payload errors show it."""
    key = {}
    for name in config.primary_key:
        spec = config.columns.get(name)
        value: Any = record
        for step in parse_path(spec.path if spec and spec.path else name):
            value = value.get(step.field) if isinstance(value, dict) else None
        key[name] = value
    return key
