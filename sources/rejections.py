"""Records a sync cannot store, kept aside when a source's ``on_bad_record`` is ``skip``.

Where it sits: normalization (``sources.normalize``, ``sources.values``) finds a record it
cannot store (a value over ``max_value_bytes``, a value that does not fit its declared type,
no primary key) and, for a ``skip`` source, hands a ``Rejection`` here instead of failing the
sync; the sync stores the rest and writes the rejections to table ``rejected_records``
(``warehouse.rejections``) in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Rejection", "record_key", "unique"]


@dataclass(frozen=True, order=True)
class Rejection:
    """One record left out of a sync: its key (``record_key``), the field at fault, and why."""

    key: str
    field: str
    reason: str


def record_key(key: Mapping[str, Any], where: str) -> str:
    """A record's primary key as sorted-key JSON; ``where`` it came (the document and place)
    when a part of the key is missing, since then the key names no record.

    >>> record_key({"id": 7}, "document 1 record #0")
    '{"id": 7}'
    >>> record_key({"id": None}, "document 2 record #5")
    'document 2 record #5'
    """
    if any(value is None for value in key.values()):
        return where
    return json.dumps(dict(key), sort_keys=True, default=str)


def unique(rejections: Iterable[Rejection]) -> list[Rejection]:
    """One rejection per record and field (a record met twice in a walk is rejected once),
    in key order.

    >>> unique([Rejection("2", "a", "x"), Rejection("1", "a", "y"), Rejection("2", "a", "z")])
    [Rejection(key='1', field='a', reason='y'), Rejection(key='2', field='a', reason='x')]
    """
    kept: dict[tuple[str, str], Rejection] = {}
    for rejection in rejections:
        kept.setdefault((rejection.key, rejection.field), rejection)
    return sorted(kept.values())
