"""Values over a source's ``max_value_bytes``, found in a document before it is normalized.

Only a document larger than the limit can hold a value larger than it, so ordinary pages
never come here: the streaming normalizer (``sources.stream``) asks about the rare large
document, and a value over the limit fails the sync with one line naming the source, the
record's key and the field, before DuckDB spends some 20 times the document's size on it.
"""

from __future__ import annotations

from typing import Any

import orjson
from changewatch.sources.base import SourceBase
from changewatch.sources.errors import PayloadError
from changewatch.sources.limits import format_size
from changewatch.sources.normalize import parse_path

__all__ = ["check_value_sizes"]


def check_value_sizes(document: bytes, records_path: str | None, config: SourceBase) -> None:
    """Raise ``PayloadError`` for the first record of ``document`` with a value over
    ``config.max_value_bytes``; return when there is none (or the document is no JSON list
    of records: normalization reports that in its own words)."""
    limit = config.max_value_bytes
    if len(document) <= limit:
        return  # no value can be larger than the document holding it
    try:
        records: Any = orjson.loads(document)
    except orjson.JSONDecodeError:
        return
    for step in (records_path or "").split(".") if records_path else ():
        records = records.get(step) if isinstance(records, dict) else None
    if not isinstance(records, list):
        return
    for record in records:
        if not isinstance(record, dict):
            continue
        for name, value in record.items():
            found = _oversized(name, value, limit)
            if found is not None:
                path, size = found
                raise PayloadError(
                    f"source {config.name!r}: record {_key(record, config)}: field {path!r} "
                    f"is {format_size(size)}, over max_value_bytes "
                    f"({format_size(limit)}); raise it in watches.yaml"
                )


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
