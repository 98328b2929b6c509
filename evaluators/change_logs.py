"""Which of a watch's sources have a change log yet: one never synced has no changes to read.

A watch over several sources runs after any one of them syncs, so on a fresh warehouse it
meets sources whose tables do not exist yet; those contribute no changes until their first
sync (which creates the log), rather than failing the watch and every sync after it.
"""

from __future__ import annotations

from changewatch.sources.base import SourceBase
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.schema import changes_table
from changewatch.warehouse.statements import render

__all__ = ["has_change_log", "not_synced_note"]


# Change logs this process has found, by warehouse (Warehouse.tables_key): once a source has
# synced its log stays, and every evaluation asks again (on PostgreSQL a lookup in
# information_schema, among the dearest statements of a small evaluation for the server).
_found: set[tuple[str, str]] = set()


def has_change_log(wh: Warehouse, source: SourceBase) -> bool:
    """Does ``source``'s change log exist in the warehouse (has it ever synced)?"""
    table = changes_table(source.table)
    key = wh.tables_key
    if key is not None and (key, table) in _found:
        return True
    found = bool(wh.fetch(render("select_columns_table", wh.dialect), (table,)))
    if found and key is not None:
        _found.add((key, table))
    return found


def not_synced_note(source: SourceBase) -> str:
    """What a watch says about a source it skipped because it never synced."""
    return f"source {source.name!r} has not synced yet: its changes are read after its first sync"
