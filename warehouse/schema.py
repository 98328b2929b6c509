"""Creates and evolves the tables a source needs: its table, its change log, bookkeeping."""

from __future__ import annotations

import re

from changewatch.sources.base import SourceBase
from changewatch.warehouse.backends import Warehouse
from changewatch.warehouse.statements import quote, render

__all__ = [
    "SQL_TYPES",
    "changes_table",
    "ensure_bookkeeping",
    "ensure_delivery_tables",
    "ensure_evaluation_tables",
    "ensure_source_tables",
    "evolved_column",
    "forget_tables",
]

SQL_TYPES = {
    "text": "TEXT",
    "bigint": "BIGINT",
    "integer": "INTEGER",
    "double": "DOUBLE PRECISION",
    "boolean": "BOOLEAN",
    "timestamp": "TIMESTAMPTZ",
    "json": "JSON",
    "text[]": "TEXT[]",
    "bigint[]": "BIGINT[]",
}


def changes_table(table: str) -> str:
    """Name of a table's change log.

    >>> changes_table("issues")
    'issues_changes'
    """
    return f"{table}_changes"


_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def evolved_column(field: str) -> str:
    """The column a drifted payload field evolves into: its name in snake_case.

    >>> evolved_column("supplierRef"), evolved_column("HTTPStatus"), evolved_column("unit-price")
    ('supplier_ref', 'http_status', 'unit_price')
    >>> evolved_column("score")
    'score'
    """
    return _WORD_START.sub("_", field).replace("-", "_").lower()


# The tables this process has seen committed, by warehouse (Warehouse.tables_key) and group.
# Every sync and every evaluation passes through ensure_*: on PostgreSQL each CREATE ... IF NOT
# EXISTS of an existing table is still a lock, a catalog lookup and a notice, some 12
# statements a changed source, in each batched run (issue 31, point 5; bench_batch_cost.py).
# Recorded only once the transaction that ran them commits, so a rolled-back first sync is
# not taken for a created schema.
_committed: set[tuple[str, str]] = set()


def _already(wh: Warehouse, group: str) -> bool:
    """Whether ``group``'s tables were committed to ``wh`` by this process; if not, they
    will count as committed once the caller's transaction commits."""
    key = wh.tables_key
    if key is None:
        return False
    if (key, group) in _committed:
        return True
    wh.after_commit(lambda: _committed.add((key, group)))
    return False


def ensure_bookkeeping(wh: Warehouse) -> None:
    """Create ``sync_state`` and ``sync_runs`` if they are missing (idempotent)."""
    if _already(wh, "bookkeeping"):
        return
    _ddl_lock(wh)
    for name in (
        "create_sync_state",
        "create_sync_runs",
        "create_http_validators",
        "create_source_fields",
        "create_rejected_records",
    ):
        wh.execute(render(name, wh.dialect))
    # Columns added in later releases, for warehouses created before them.
    _add_missing_columns(wh, "sync_runs", _SYNC_RUNS_ADDED)
    _add_missing_columns(wh, "http_validators", {"walk": "TEXT"})


# sync_runs columns added in later releases, for warehouses created before them.
_SYNC_RUNS_ADDED = {
    "silent": "BOOLEAN",
    "storm_held": "BOOLEAN",
    "not_modified": "BOOLEAN",
    "rows_duplicate": "BIGINT",
}


def ensure_evaluation_tables(wh: Warehouse) -> None:
    """Create the tables watches write (watermarks, evaluations, verdict cache, outbox) and the
    ``decisions`` view over them."""
    if _already(wh, "evaluation"):
        return
    _ddl_lock(wh)
    for name in (
        "create_watch_state",
        "create_evaluations",
        "create_judge_cache",
        "create_judge_prompts",
        "create_judge_spend",
        "create_outbox",
        "create_deliveries",
    ):
        wh.execute(render(name, wh.dialect))
    _add_missing_columns(wh, "evaluations", {"filter_error": "TEXT"})
    _add_missing_columns(wh, "outbox", _OUTBOX_DEBOUNCE)
    # After the columns it reads: a view over an older evaluations table would lack them.
    # Created when missing only: every evaluation passes here, and CREATE OR REPLACE rewrites
    # the view in the catalog each time. A view of an older release lacks the newest column
    # (`suppressed`, from debounce): it is dropped and created anew.
    view = {row[0] for row in wh.fetch(render("select_columns_table", wh.dialect), ("decisions",))}
    if _DECISIONS_NEWEST not in view:
        if view:
            wh.execute(render("drop_view_decisions", wh.dialect))
        wh.execute(render("create_decisions", wh.dialect))


# Outbox columns added with debounce, for warehouses created before it.
_OUTBOX_DEBOUNCE = {
    "due_at": "TIMESTAMPTZ",
    "settled_at": "TIMESTAMPTZ",
    "suppressed": "TEXT",
    # Added with ordering: the change's time, carried in every payload.
    "changed_at": "TIMESTAMPTZ",
}
# The column the current decisions view added last: a view without it is an older one.
_DECISIONS_NEWEST = "suppressed"


def ensure_delivery_tables(wh: Warehouse) -> None:
    """Create the outbox, delivery and digest tables (idempotent)."""
    if _already(wh, "delivery"):
        return
    _ddl_lock(wh)
    for name in ("create_outbox", "create_deliveries", "create_digests", "create_channel_circuits"):
        wh.execute(render(name, wh.dialect))
    _add_missing_columns(wh, "outbox", _OUTBOX_DEBOUNCE)


def ensure_source_tables(wh: Warehouse, config: SourceBase) -> list[str]:
    """Create the source's table and change log, adding declared columns they lack.

    Returns the columns added to existing tables (empty on creation or when nothing changed).
    Once this process has committed them for the same table and columns, it does nothing.
    """
    table, changes = config.table, changes_table(config.table)
    # Every sync passes here: on PostgreSQL the DDL lock, two CREATE ... IF NOT EXISTS and
    # three catalog lookups, six statements a sync once the tables exist (issue 31, point 5).
    # Keyed by what the DDL below depends on, so a config that declares a column more still
    # adds it.
    declared = ",".join(f"{name}:{spec.type}" for name, spec in config.columns.items())
    if _already(wh, f"source {table} ({declared}) key ({','.join(config.primary_key)})"):
        return []
    _ddl_lock(wh)
    column_defs = ", ".join(
        f"{quote(name)} {SQL_TYPES[spec.type]}" for name, spec in config.columns.items()
    )
    value_defs = ", ".join(
        f"{quote(prefix + name)} {SQL_TYPES[spec.type]}"
        for name, spec in config.columns.items()
        for prefix in ("old_", "new_")
    )
    create_entity = render(
        "create_entity",
        wh.dialect,
        table=quote(table),
        column_defs=column_defs,
        primary_key=", ".join(quote(k) for k in config.primary_key),
    )
    # After transpiling: sqlglot knows no column storage clauses.
    wh.execute(create_entity.replace(" _raw JSON,", f" _raw JSON{wh.raw_storage},", 1))
    wh.execute(render("create_changes", wh.dialect, changes=quote(changes), value_defs=value_defs))
    added = _add_missing_columns(
        wh, table, {n: SQL_TYPES[s.type] for n, s in config.columns.items()}
    )
    # Tables created before payload hashes were stored: NULL means "not known yet", and the
    # next sync writes every fetched payload (and its hash) once.
    _add_missing_columns(wh, table, {"_raw_hash": "BIGINT"})
    _add_missing_columns(
        wh,
        changes,
        {p + n: SQL_TYPES[s.type] for n, s in config.columns.items() for p in ("old_", "new_")}
        | {
            "silent": "BOOLEAN NOT NULL DEFAULT FALSE",
            "held": "BOOLEAN NOT NULL DEFAULT FALSE",
            "released_at": "TIMESTAMPTZ",
        },
    )
    return added


def forget_tables() -> None:
    """Forget which tables this process committed, so the next ``ensure_*`` checks them again:
    for a process whose warehouse was changed under it (a test playing an older release)."""
    _committed.clear()


def _add_missing_columns(wh: Warehouse, table: str, wanted: dict[str, str]) -> list[str]:
    """Add the columns of ``wanted`` (name -> SQL type) that ``table`` lacks; return them."""
    # A column declared after the table was created: add it (NULL for existing rows) rather
    # than fail, so editing config never requires dropping synced data.
    present = {row[0] for row in wh.fetch(render("select_columns_table", wh.dialect), (table,))}
    missing = [name for name in wanted if name not in present]
    for name in missing:
        wh.execute(
            render(
                "alter_table_add_column",
                wh.dialect,
                table=quote(table),
                column=quote(name),
                sql_type=wanted[name],
            )
        )
    return missing


def _ddl_lock(wh: Warehouse) -> None:
    # Two transactions running CREATE TABLE IF NOT EXISTS at once can both miss the table and
    # then collide in Postgres' catalog; serialize schema changes for the transaction.
    wh.lock("changewatch:ddl")
