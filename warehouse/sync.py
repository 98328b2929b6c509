"""One sync of one source: fetch, normalize, diff against the table, commit rows + changes + cursor.

The fetched rows wait in the sync's stage (a private DuckDB that spills to disk, see
``sources.staged``); the stored keys and hashes are streamed in next to them and the diff and
the change log are SQL there, so memory follows the batch size, not the table's. A snapshot
sync streams them in while its walk starts, so rows that match their stored version are
staged as their key only (once the keys are in), and only payloads that moved are written
back. The write is
one transaction holding the new rows, the change-log entries, the cursor and the run record,
streamed in record batches, so a sync either lands whole or not at all and can simply be run
again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa
from changewatch import sql
from changewatch.sources.base import IDENTIFIER, FetchResult, Source, SourceBase, Validator
from changewatch.sources.errors import PayloadError
from changewatch.sources.normalize import (
    HASH_COLUMN,
    RAW_COLUMN,
    RAW_HASH_COLUMN,
    SYNCED_AT_COLUMN,
)
from changewatch.sources.rejections import Rejection, unique
from changewatch.sources.staged import STAGE_TYPES, STREAM_ROWS, StagedFetch
from changewatch.sources.stream import StreamingNormalizer
from changewatch.warehouse.backends import ConnectionLost, Warehouse
from changewatch.warehouse.rejections import replace_rejected
from changewatch.warehouse.schema import (
    SQL_TYPES,
    changes_table,
    ensure_bookkeeping,
    ensure_source_tables,
    evolved_column,
)
from changewatch.warehouse.statements import literal, quote, render
from changewatch.warehouse.sync_lock import SyncSkipped, sync_lock, sync_lock_key

__all__ = [
    "SyncConflict",
    "SyncSkipped",
    "SyncStats",
    "apply_sync",
    "format_cursor",
    "held_changes",
    "release_changes",
    "run_sync",
]


class SyncConflict(SyncSkipped):
    """Another sync of the same source committed while this one was fetching.

    Applying this one's older view would move rows and cursor backwards, so it is dropped;
    the next sync starts from the newer state. (Syncs that all take the source's lock
    (``sync_lock``) never meet so; one that does not, could.)
    """


@dataclass
class SyncStats:
    """What one sync did; every field is also materialization metadata."""

    source: str
    sync_id: str
    status: str = "running"
    pages: int = 0
    requests: int = 0
    rows_fetched: int = 0
    # Records whose key had already come in this sync: merged, one row per key (the newest
    # by updated-at, else the last in walk order, wins; see StagedFetch.keep_newest).
    rows_duplicate: int = 0
    # Records left out (on_bad_record: skip), one per key and field: see rejected_records.
    rejected: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    row_count: int = 0
    cursor_before: str | None = None
    cursor_after: str | None = None
    columns_added: tuple[str, ...] = ()
    # The changes were recorded silently (a baseline or a backfill): no watch evaluates them.
    silent: bool = False
    # The sync changed too much at once; its changes wait for `changewatch release`.
    storm_held: bool = False
    # Every request was answered 304: nothing was parsed.
    not_modified: bool = False
    # Payload fields seen for the first time (schema drift): field -> type.
    drift: dict[str, str] = field(default_factory=dict)
    # What became of each drifted field: "column <name>", or why it stays in _raw only.
    drift_actions: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def changed(self) -> int:
        return self.inserted + self.updated + self.deleted

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"changed": self.changed}


def format_cursor(value: datetime | None) -> str | None:
    """ISO-8601 text of a cursor timestamp, in UTC with a ``Z``.

    >>> format_cursor(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    '2026-01-02T03:04:05Z'
    """
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def run_sync(
    wh: Warehouse,
    source: Source,
    *,
    dagster_run_id: str | None = None,
    now: datetime | None = None,
    silent: bool = False,
    full: bool = False,
) -> SyncStats:
    """Sync ``source`` into ``wh`` once and return what happened (see ``_run_sync``).

    Raises ``SyncSkipped``, having recorded and fetched nothing, when another sync of the
    source holds its lock (``sync_lock``).
    """
    # A fleet's targets share its lock: they write one table and its change log.
    with sync_lock(wh, source.config.owner):
        return _run_sync(
            wh, source, dagster_run_id=dagster_run_id, now=now, silent=silent, full=full
        )


def _run_sync(
    wh: Warehouse,
    source: Source,
    *,
    dagster_run_id: str | None,
    now: datetime | None,
    silent: bool,
    full: bool,
) -> SyncStats:
    """Sync ``source`` into ``wh`` once and return what happened.

    Records the attempt in ``sync_runs`` first (its own transaction), fetches from the stored
    cursor (with the stored HTTP validators), then applies everything in one transaction. On
    failure the attempt is marked failed and the exception propagates; nothing of the failed
    sync is stored.

    ``silent`` records the changes without handing them to watches (a backfill); the first
    sync of a source is silent anyway unless its ``baseline`` is ``evaluate``. ``full`` walks
    the complete listing, ignoring cursor and validators, so objects that vanished from an
    incremental API become deletes: the reconciliation sweep.
    """
    config = source.config
    started = time.perf_counter()
    started_at = now or datetime.now(UTC)
    sync_id = f"{config.name}-{started_at:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    with wh.transaction():
        ensure_bookkeeping(wh)
        columns_added = ensure_source_tables(wh, config)
        state = wh.fetch(render("select_sync_state", wh.dialect), (config.name,))
        cursor = state[0][0] if state else None
        validators = {} if full else _stored_validators(wh, config)
        known = {
            row[0]: (row[1], row[2])
            for row in wh.fetch(render("select_source_fields", wh.dialect), (config.owner,))
        }
        wh.execute(
            render("insert_sync_runs", wh.dialect),
            (sync_id, config.name, dagster_run_id, started_at, cursor),
        )
        wh.execute(render("abandon_sync_runs", wh.dialect), (config.name, sync_id))
    if full and not config.lists_everything:
        raise ValueError(f"source {config.name!r} cannot list everything: no full sweep")
    if not state:
        # A source's first sync: its table is probably loaded on the side (bulk_load_aside).
        wh.prepare_load_aside()
    stats = SyncStats(
        source=config.name,
        sync_id=sync_id,
        cursor_before=cursor,
        columns_added=tuple(columns_added),
        silent=silent or (not state and config.baseline == "silent"),
    )
    try:
        # Pages are normalized on a worker thread while the walk goes on.
        with StreamingNormalizer(config, known_fields=list(known) if known else None) as pages:
            if full or (config.sync == "snapshot" and config.lists_everything):
                # The walk lists everything: its stored keys and hashes are needed anyway, and
                # with them in the stage, unchanged rows are staged without payload. They load
                # while the walk starts (nothing else uses the warehouse's connection until the
                # walk ends); batches staged before they are in are staged whole. A sync
                # committed meanwhile is caught by apply_sync (SyncConflict).
                pages.stage.load_stored_aside(lambda: _load_every_stored(wh, config, pages.stage))
            fetched = source.fetch(
                cursor=None if full else cursor, validators=validators, sink=pages.add
            )
            if full:
                # Nothing was conditional and nothing was filtered by a cursor: everything.
                fetched.complete = True
            staged, fields = pages.finish(fetched, synced_at=started_at)
            if pages.rejected:
                # A record left out is neither stored nor gone: no deletes are inferred, and no
                # validator is kept, so the next sync asks for everything again.
                fetched.complete = False
                fetched.validators = {}
            wh.make_room(pages.largest_document)
            stats.drift = {f: t for f, t in fields.items() if known and f not in known and t}
            if stats.drift and config.schema_mode == "freeze":
                raise PayloadError(
                    f"source {config.name!r}: new payload fields {sorted(stats.drift)} and the "
                    "source's schema is frozen: declare them as columns, or set schema: evolve "
                    "or schema: discard"
                )
            # A drifted field the config has since declared is a column like any other.
            evolved = {
                f: t
                for f, (t, action) in known.items()
                if action == "evolved" and evolved_column(f) not in config.columns
            }
            apply_sync(
                wh,
                config,
                staged,
                fetched,
                stats,
                started=started,
                fields=fields,
                evolved=evolved,
                expected_last_sync=state[0][2] if state else None,
                rejected=pages.rejected,
            )
    except BaseException as error:
        _record_failure(wh, stats, error)
        if isinstance(error, ConnectionLost):
            raise ConnectionLost(
                f"source {config.name!r}: {error} during the sync; nothing of it is stored, "
                "so it can simply run again"
            ) from error
        raise
    return stats


def apply_sync(
    wh: Warehouse,
    config: SourceBase,
    staged: StagedFetch,
    fetched: FetchResult,
    stats: SyncStats,
    *,
    started: float | None = None,
    fields: dict[str, str | None] | None = None,
    evolved: dict[str, str] | None = None,
    expected_last_sync: str | None = None,
    rejected: Sequence[Rejection] = (),
) -> SyncStats:
    """Diff ``staged`` against the stored table and commit rows, changes and cursor at once.

    ``staged`` holds the fetch normalized (``StreamingNormalizer.finish``). Deletes are
    inferred only when ``fetched.complete`` (the fetch listed everything). ``fields``
    are the payload fields the fetch saw (recorded for schema drift), ``evolved`` the
    drifted fields that are already columns. ``expected_last_sync`` is the source's last
    sync when this one started: if another sync committed since, this one raises
    ``SyncConflict`` and writes nothing. ``rejected``: the records a ``skip`` source left
    out; they replace its rows of ``rejected_records``, and the cursor stays where it was, so
    they come again. Updates ``stats`` in place.
    """
    started = time.perf_counter() if started is None else started
    keys = config.primary_key
    stats.pages, stats.requests = fetched.pages, fetched.requests
    height = staged.height
    stats.rows_duplicate = staged.duplicates
    stats.rejected = len(unique(rejected))
    stats.rows_fetched = fetched.record_count if fetched.record_count is not None else height
    finished_at = datetime.now(UTC)
    with wh.transaction():
        # Two syncs of one source must not interleave their read-diff-write; Dagster's tag
        # limit keeps them apart, and this lock holds even for runs started outside Dagster.
        wh.lock(sync_lock_key(config.owner))
        previous = wh.fetch(render("select_sync_state", wh.dialect), (config.name,))
        if (previous[0][2] if previous else None) != expected_last_sync:
            raise SyncConflict(
                f"skipped: another sync of {config.name} committed while this one was fetching; "
                "this one is dropped (the next sync starts from the newer state)"
            )
        if not staged.has_stored:
            _load_stored(wh, config, staged, complete=fetched.complete)
        # What the stage tells, read once for every use below (a query on the stage costs
        # about a millisecond whatever its size: a small sync makes a dozen).
        facts = _stage_facts(staged, config)
        stored_rows = facts.stored if fetched.complete or (wh.loads_aside and height) else None
        # Nothing stored to compare with (a first sync): every fetched row is an insert, and
        # the warehouse may start loading them into the table on its side right away, while
        # the diff and the change log are worked out here. Only with no payload fields known
        # yet: then no field can become a column in this sync, under the load's feet.
        first_load = (
            wh.loads_aside
            and height
            and not stored_rows
            and not wh.fetch(render("select_source_fields", wh.dialect), (config.owner,))
        )
        with _loading_aside(wh, config, staged) if first_load else nullcontext(False) as aside:
            _create_diff(staged, keys, complete=fetched.complete)
            by_kind = dict(staged.fetch("SELECT kind, count(*) FROM diff GROUP BY kind"))
            stats.inserted = by_kind.get("insert", 0)
            stats.updated = by_kind.get("update", 0)
            stats.deleted = by_kind.get("delete", 0)
            stats.unchanged = height - stats.inserted - stats.updated
            stats.not_modified = fetched.not_modified
            stats.storm_held = not stats.silent and _is_storm(
                config, stats, previous[0][1] if previous else None
            )
            evolved = dict(evolved or {})
            if fields:
                evolved |= _record_fields(wh, config, staged, fields, stats, finished_at, evolved)
            if stats.changed:
                _write_changes(wh, config, staged, stats, finished_at, evolved, loaded_aside=aside)
        if facts.payloads_moved:
            _refresh_raw(wh, config, staged, evolved)
        if not fetched.not_modified:
            _replace_validators(wh, config, fetched)
        replace_rejected(wh, config.name, rejected, sync_id=stats.sync_id, at=finished_at)
        # Held while a record is rejected: an incremental walk from a later cursor would
        # never ask for it again.
        cursor_after = (
            stats.cursor_before if rejected else _next_cursor(stats.cursor_before, facts.newest)
        )
        if stored_rows is not None and fetched.complete:
            # The stage holds every stored key already: no second scan of the table.
            stats.row_count = stored_rows + stats.inserted - stats.deleted
        elif not previous or previous[0][1] is None:
            stats.row_count = _count(wh, config)
        else:
            stats.row_count = previous[0][1] + stats.inserted - stats.deleted
        stats.cursor_after = cursor_after
        stats.status = "succeeded"
        stats.duration_s = round(time.perf_counter() - started, 3)
        wh.execute(
            render("upsert_sync_state", wh.dialect),
            (config.name, config.table, cursor_after, stats.sync_id, finished_at, stats.row_count),
        )
        wh.execute(render("finish_sync_runs", wh.dialect), _finish_params(stats, finished_at, None))
    return stats


def _create_diff(staged: StagedFetch, keys: list[str], *, complete: bool) -> None:
    """Stage table ``diff``: the fetched keys whose hash differs from the stored one, and, when
    the fetch is ``complete``, the stored keys it did not meet (``sql/create_diff_fetched.sql``)."""
    staged.execute(
        sql.load("create_diff_fetched").format(
            keys=", ".join(f"coalesce(f.{quote(k)}, s.{quote(k)}) AS {quote(k)}" for k in keys),
            join="FULL" if complete else "LEFT",
            key_join=_key_join(keys, "f", "s"),
            seen_join=_key_join(keys, "s", "w"),
        )
    )


def _load_every_stored(wh: Warehouse, config: SourceBase, staged: StagedFetch) -> None:
    """``_load_stored`` of every stored key, in a read transaction committed at once."""
    with wh.transaction():
        _load_stored(wh, config, staged, complete=True)


def _load_stored(wh: Warehouse, config: SourceBase, staged: StagedFetch, *, complete: bool) -> None:
    """Stream the stored keys and hashes the diff needs into the stage, as table ``stored``."""
    table = quote(config.table)
    keys = ", ".join(quote(k) for k in config.primary_key)
    if complete:
        if (scope := config.target_scope) is not None:
            # A fleet target's complete listing is its own rows: others' are no deletes.
            query = render(
                "select_hashes_entity_target",
                wh.dialect,
                table=table,
                primary_key=keys,
                column=quote(scope.column),
            )
            staged.load_stored(wh.fetch_batches(query, (scope.value,)))
            return
        query = render("select_hashes_entity", wh.dialect, table=table, primary_key=keys)
        staged.load_stored(wh.fetch_batches(query))
        return
    # Incremental: look up only the fetched keys, so cost follows what the API returned.
    with wh.staged("cw_fetched_keys", staged.arrow(f"SELECT {keys} FROM walked")) as stage:
        query = render(
            "select_hashes_entity_staged",
            wh.dialect,
            table=table,
            stage=stage,
            t_primary_key=", ".join(f"t.{quote(k)}" for k in config.primary_key),
            key_join=_key_join(config.primary_key),
        )
        staged.load("stored", wh.fetch_batches(query))


def _from_raw(field: str, field_type: str, raw: str = "_raw") -> str:
    """SQL (Postgres syntax, transpiled per backend) reading a drifted field from the raw JSON.

    >>> print(_from_raw("score", "double"))
    CAST(CAST(_raw AS JSON) ->> 'score' AS DOUBLE PRECISION)
    """
    key = "'" + field.replace("'", "''") + "'"
    if field_type == "json":
        return f"CAST(CAST({raw} AS JSON) -> {key} AS JSON)"
    return f"CAST(CAST({raw} AS JSON) ->> {key} AS {SQL_TYPES[field_type]})"


def _record_fields(
    wh: Warehouse,
    config: SourceBase,
    staged: StagedFetch,
    fields: dict[str, str | None],
    stats: SyncStats,
    seen_at: datetime,
    evolved: dict[str, str],
) -> dict[str, str]:
    """Remember the payload fields; make new ones columns when the source evolves.

    Returns the fields that became columns in this sync.
    """
    known = {
        row[0] for row in wh.fetch(render("select_source_fields", wh.dialect), (config.owner,))
    }
    baseline = not known
    new = {f: t for f, t in fields.items() if f not in known}
    if not new:
        return {}
    become_columns: dict[str, str] = {}
    if not baseline:
        if config.schema_mode == "evolve":
            become_columns = _evolving(config, new, evolved, stats.drift_actions)
        else:
            stats.drift_actions |= {f: "raw only (schema: discard)" for f in new}
    action = {f: "baseline" if baseline else "discarded" for f in new} | {
        f: "evolved" for f in become_columns
    }
    found = pl.DataFrame(
        {
            "source": [config.owner] * len(new),
            "field": list(new),
            # For an evolved field, the type of its column; otherwise the values' type.
            "field_type": [become_columns.get(f, new[f]) for f in new],
            "action": [action[f] for f in new],
            "first_seen_at": [seen_at] * len(new),
            "sync_id": [stats.sync_id] * len(new),
        },
        schema={
            "source": pl.String,
            "field": pl.String,
            "field_type": pl.String,
            "action": pl.String,
            "first_seen_at": pl.Datetime("us", "UTC"),
            "sync_id": pl.String,
        },
    )
    with wh.staged("cw_fields", found) as stage:
        wh.execute(render("insert_source_fields_staged", wh.dialect, stage=stage))
    if become_columns:
        for f, t in become_columns.items():
            wh.execute(
                render(
                    "alter_table_add_column",
                    wh.dialect,
                    table=quote(config.table),
                    column=quote(evolved_column(f)),
                    sql_type=SQL_TYPES[t],
                )
            )
        assignments = ", ".join(
            ["_raw = CAST(s._raw AS JSON)", "_raw_hash = s._raw_hash"]
            + [
                f"{quote(evolved_column(f))} = {_from_raw(f, t, 's._raw')}"
                for f, t in become_columns.items()
            ]
        )
        keys = ", ".join(quote(k) for k in config.primary_key)
        # Rows in `seen` are their stored version, which came from a sync that recorded
        # every field it saw: they hold none of the new fields.
        drifted_rows = f"SELECT {keys}, {RAW_COLUMN}, {RAW_HASH_COLUMN} FROM fetched"
        with (
            staged.reader(drifted_rows) as drifted,
            wh.staged("cw_drifted", drifted) as stage,
        ):
            wh.execute(
                render(
                    "update_entity_staged_evolved",
                    wh.dialect,
                    table=quote(config.table),
                    stage=stage,
                    assignments=assignments,
                    key_join=_key_join(config.primary_key),
                )
            )
    return become_columns


def _refresh_raw(
    wh: Warehouse,
    config: SourceBase,
    staged: StagedFetch,
    evolved: dict[str, str],
) -> None:
    """Store the current ``_raw`` (and evolved columns) of fetched rows that did not change
    but whose payload did.

    The content hash covers declared columns only, so a change to undeclared fields is no
    change; the stored payload should still be the one upstream has now. Only payloads whose
    hash differs from the stored one (or is not stored yet) travel to the warehouse.
    """
    keys = config.primary_key
    moved = _moved_payloads(keys)
    assignments = ", ".join(
        ["_raw = CAST(s._raw AS JSON)", "_raw_hash = s._raw_hash"]
        + [f"{quote(evolved_column(f))} = {_from_raw(f, t, 's._raw')}" for f, t in evolved.items()]
    )
    # Streamed: once, when the payloads' hashes are not stored yet, this is every fetched row.
    with staged.reader(moved) as rows, wh.staged("cw_raw", rows) as stage:
        wh.execute(
            render(
                "update_entity_staged_raw",
                wh.dialect,
                table=quote(config.table),
                stage=stage,
                assignments=assignments,
                key_join=_key_join(keys),
            )
        )


def _moved_payloads(keys: list[str]) -> str:
    """The stage's query of the fetched rows whose content matches the stored version but
    whose payload does not (``_refresh_raw``)."""
    key_list = ", ".join(f"f.{quote(k)}" for k in keys)
    return (
        f"SELECT {key_list}, f.{RAW_COLUMN}, f.{RAW_HASH_COLUMN} FROM fetched AS f "
        f"JOIN stored AS s ON {_key_join(keys, 'f', 's')} "
        f"WHERE f.{HASH_COLUMN} = s.{HASH_COLUMN} "
        f"AND f.{RAW_HASH_COLUMN} IS DISTINCT FROM s.{RAW_HASH_COLUMN}"
    )


@dataclass(frozen=True)
class _StageFacts:
    stored: int  # rows in table ``stored``
    newest: datetime | None  # the latest updated-at walked (None: none, or no updated-at)
    payloads_moved: bool  # whether ``_refresh_raw`` has rows to write


def _stage_facts(staged: StagedFetch, config: SourceBase) -> _StageFacts:
    """Three facts ``apply_sync`` needs of the stage, in one query: none of them changes
    during the rest of the sync (the diff, the change log and old rows are tables of their
    own; ``fetched``, ``seen`` and ``stored`` are complete and left as they are)."""
    newest = (
        f"(SELECT max({quote(config.updated_at)}) FROM walked)" if config.updated_at else "NULL"
    )
    stored, latest, moved = staged.fetch(
        f"SELECT (SELECT count(*) FROM stored), {newest}, "
        f"EXISTS ({_moved_payloads(config.primary_key)})"
    )[0]
    return _StageFacts(stored=stored, newest=latest, payloads_moved=bool(moved))


def _evolving(
    config: SourceBase, new: dict[str, str | None], evolved: dict[str, str], actions: dict[str, str]
) -> dict[str, str]:
    """The new fields that become columns (field -> column type); says why in ``actions``.

    Text (or JSON for objects and lists), whatever the first values looked like: upstream
    may send 7 today and "n/a" tomorrow, and a typed column would then fail every sync.
    Declaring the field as a column gives it a type.
    """
    taken = {evolved_column(f): f for f in evolved} | {c: c for c in config.columns}
    become = {}
    for f, t in new.items():
        column = evolved_column(f)
        declared = config.columns.get(column)
        if declared is not None and (declared.path or column) == f:
            actions[f] = f"column {column} (declared)"
        elif not IDENTIFIER.match(column) or column.startswith("_") or len(column) > 59:
            actions[f] = f"raw only: {column!r} is no column name"
        elif column in taken:
            owner = "a declared column" if taken[column] in config.columns else repr(taken[column])
            actions[f] = f"raw only: column {column!r} is {owner}"
        else:
            taken[column] = f
            become[f] = "json" if t == "json" else "text"
            actions[f] = f"column {column}"
    return become


def _is_storm(config: SourceBase, stats: SyncStats, previous_rows: int | None) -> bool:
    """Did this sync change more of the source than its storm guard allows?

    >>> from changewatch.sources.base import SourceBase
    >>> config = SourceBase(name="s", type="rest", table="t", primary_key="id",
    ...                     columns={"id": "bigint"})
    >>> stats = SyncStats(source="s", sync_id="x", updated=80)
    >>> _is_storm(config, stats, 100), _is_storm(config, stats, 1000), _is_storm(config, stats, 0)
    (True, False, False)
    """
    guard = config.storm
    if not guard.enabled or not previous_rows or previous_rows < guard.min_rows:
        return False
    return stats.changed > guard.max_share * previous_rows


# Validators a sync writes one statement each; more are staged and inserted at once. Staging
# is some six statements on PostgreSQL (a temporary table made, filled and dropped), while most
# sources' walks are a page or two.
FEW_VALIDATORS = 4


def _stored_validators(wh: Warehouse, config: SourceBase) -> dict[str, Validator]:
    rows = wh.fetch(render("select_http_validators", wh.dialect), (config.name,))
    return {
        key: Validator(etag=etag, last_modified=modified, walk=walk)
        for key, etag, modified, walk in rows
    }


def _replace_validators(wh: Warehouse, config: SourceBase, fetched: FetchResult) -> None:
    # Inside the sync transaction: the validators commit with the rows they describe.
    wh.execute(render("delete_http_validators", wh.dialect), (config.name,))
    if not fetched.validators:
        return
    if len(fetched.validators) <= FEW_VALIDATORS:
        for key, v in fetched.validators.items():
            wh.execute(
                render("insert_http_validators", wh.dialect),
                (config.name, key, v.etag, v.last_modified, v.walk),
            )
        return
    staged = pl.DataFrame(
        {
            "source": [config.name] * len(fetched.validators),
            "request_key": list(fetched.validators),
            "etag": [v.etag for v in fetched.validators.values()],
            "last_modified": [v.last_modified for v in fetched.validators.values()],
            "walk": [v.walk for v in fetched.validators.values()],
        },
        schema={k: pl.String for k in ("source", "request_key", "etag", "last_modified", "walk")},
    )
    with wh.staged("cw_validators", staged) as stage:
        wh.execute(render("insert_http_validators_staged", wh.dialect, stage=stage))


def _write_changes(
    wh: Warehouse,
    config: SourceBase,
    staged: StagedFetch,
    stats: SyncStats,
    detected_at: datetime,
    evolved: dict[str, str],
    *,
    loaded_aside: bool = False,
) -> None:
    """Write the changed rows and the change log; with ``loaded_aside``, the rows (every
    fetched row, all new) are already on their way into the table (``_loading_aside``)."""
    keys, columns = config.primary_key, list(config.columns)
    table = quote(config.table)
    key_list = ", ".join(quote(k) for k in keys)
    if stats.updated or stats.deleted:
        # Keys only: small next to the rows, and the warehouse reads them twice.
        touched = staged.arrow(f"SELECT {key_list} FROM diff WHERE kind <> 'insert'")
        with wh.staged("cw_touched_keys", touched) as stage:
            old_rows = render(
                "select_rows_entity_staged",
                wh.dialect,
                table=table,
                stage=stage,
                key_join=_key_join(keys),
                columns=", ".join(
                    # JSON leaves as text: Arrow has no portable JSON type.
                    f"CAST(t.{quote(c)} AS TEXT) AS {quote(c)}"
                    if config.columns[c].type == "json"
                    else f"t.{quote(c)}"
                    for c in columns
                ),
            )
            staged.load("old_rows", wh.fetch_batches(old_rows))
            wh.execute(
                render(
                    "delete_entity_staged",
                    wh.dialect,
                    table=table,
                    stage=stage,
                    key_join=_key_join(keys),
                )
            )
    else:
        staged.execute(
            "CREATE OR REPLACE TABLE old_rows AS "
            f"SELECT {', '.join(quote(c) for c in columns)} FROM fetched LIMIT 0"
        )
    if not (stats.inserted or stats.updated):
        _write_change_log(wh, config, staged, stats, detected_at)
        return
    every_row_new = not (stats.updated or stats.deleted or stats.unchanged)
    if not loaded_aside:
        upserts_query = sql.load(
            "select_inserts_fetched" if every_row_new else "select_upserts_fetched"
        ).format(
            columns=", ".join(f"f.{quote(c)}" for c in columns),
            key_join=_key_join(keys, "f", "d"),
        )
        with staged.reader(upserts_query, [staged.synced_at]) as upserts:
            _write_upserts(wh, config, upserts, evolved, maybe_empty=every_row_new)
    _write_change_log(
        wh,
        config,
        staged,
        stats,
        detected_at,
        # Two streams at once get half-size batches each: the rows in flight stay as many.
        rows=STREAM_ROWS // 2 if loaded_aside else STREAM_ROWS,
        inserts_only=every_row_new,
    )


@contextmanager
def _loading_aside(wh: Warehouse, config: SourceBase, staged: StagedFetch) -> Iterator[bool]:
    """Every fetched row, streamed into the source's table by the warehouse on its side
    (``bulk_load_aside``) while the ``with`` block runs; yields whether it does."""
    query = sql.load("select_inserts_fetched").format(
        columns=", ".join(f"f.{quote(c)}" for c in config.columns)
    )
    staged.two_streams()  # this one, and the change log's
    with (
        staged.reader(query, [staged.synced_at], rows=STREAM_ROWS // 2) as rows,
        wh.bulk_load_aside(config.table, rows) as loading,
    ):
        yield loading


def _write_upserts(
    wh: Warehouse,
    config: SourceBase,
    upserts: pa.RecordBatchReader,
    evolved: dict[str, str],
    *,
    maybe_empty: bool = True,
) -> None:
    """Append the new rows and new versions of ``upserts`` to the source's table
    (``maybe_empty``: see ``Warehouse.bulk_load``)."""
    columns = list(config.columns)
    _append(
        wh,
        config.table,
        upserts,
        # Evolved columns are computed from the raw payload in SQL; otherwise a bulk path.
        bulk=not evolved,
        maybe_empty=maybe_empty,
        statement="insert_entity_staged",
        table=quote(config.table),
        columns=", ".join(quote(c) for c in columns),
        select_columns=_select_list(config, columns),
        evolved_columns="".join(f", {quote(evolved_column(f))}" for f in evolved),
        evolved_values="".join(f", {_from_raw(f, t)}" for f, t in evolved.items()),
    )


def _append(
    wh: Warehouse,
    target: str,
    rows: pa.RecordBatchReader,
    *,
    bulk: bool,
    statement: str,
    maybe_empty: bool = True,
    **sql,
) -> None:
    """Append ``rows`` to table ``target``: on the warehouse's bulk path when ``bulk`` and it
    has one (``maybe_empty``: see ``Warehouse.bulk_load``), otherwise by ``statement``
    (``INSERT ... SELECT`` from the rows staged as ``{stage}``)."""
    if bulk and wh.bulk_load(target, rows, maybe_empty=maybe_empty):
        return
    with wh.staged(f"cw_{statement}", rows) as stage:
        wh.execute(render(statement, wh.dialect, stage=stage, **sql))


def _write_change_log(
    wh: Warehouse,
    config: SourceBase,
    staged: StagedFetch,
    stats: SyncStats,
    detected_at: datetime,
    *,
    rows: int = STREAM_ROWS,
    inserts_only: bool = False,
) -> None:
    """Append the sync's change-log entries (numbered on from the log's last id), streamed in
    batches of ``rows``. ``inserts_only``: every fetched row is new, and nothing else changed
    (a first sync)."""
    change_table = changes_table(config.table)
    change_log = quote(change_table)
    first_id = wh.fetch(render("select_next_id_changes", wh.dialect, changes=change_log))[0][0]
    params = [first_id, stats.sync_id, detected_at, stats.silent, stats.storm_held]
    types = {p + c: spec.type for c, spec in config.columns.items() for p in ("old_", "new_")}
    query = _change_log_query(config, inserts_only=inserts_only)
    with staged.reader(query, params, rows=rows) as log:
        # The columns the query fills; the rest of each entry is left to the table's defaults
        # (NULL), which costs nothing to send.
        columns = log.schema.names
        _append(
            wh,
            change_table,
            log,
            bulk=True,
            # The log's highest id is past 0: it holds rows, and no check is needed.
            maybe_empty=first_id == 1,
            statement="insert_changes_staged",
            changes=change_log,
            columns=", ".join(quote(c) for c in columns),
            select_values=_select_list(config, columns, types=types),
        )


def _change_log_query(config: SourceBase, *, inserts_only: bool = False) -> str:
    """The stage's query for the change log (``sql/select_changes_fetched.sql``) of ``config``;
    with ``inserts_only``, that of a sync whose every fetched row is new
    (``sql/select_insert_changes_fetched.sql``: the same entries, without the empty columns).

    Key columns never change; both sides carry the key so filters can use old_x and new_x.
    """
    keys, columns = config.primary_key, list(config.columns)
    rows = "f" if inserts_only else "d"  # where the keys are read from
    if len(keys) == 1:
        object_key = f"CAST({rows}.{quote(keys[0])} AS VARCHAR)"
    else:
        fields = ", ".join(f"{quote(k)} := {rows}.{quote(k)}" for k in keys)
        object_key = f"CAST(to_json(struct_pack({fields})) AS VARCHAR)"
    new = {c: f"f.{quote(c)}" for c in columns}
    if inserts_only:
        order = [f"{new[config.updated_at]} NULLS LAST"] if config.updated_at else []
        return sql.load("select_insert_changes_fetched").format(
            keys=", ".join(f"f.{quote(k)}" for k in keys),
            order=", ".join([*order, f"{object_key} NULLS LAST"]),
            object_key=object_key,
            values=", ".join(f"{new[c]} AS {quote('new_' + c)}" for c in columns),
            ordered_join=_key_join(keys, "r", "f"),
        )
    old = {c: f"CAST(o.{quote(c)} AS {STAGE_TYPES[config.columns[c].type]})" for c in columns}
    for k in keys:
        old[k] = f"CASE WHEN d.kind <> 'insert' THEN d.{quote(k)} END"
        new[k] = f"CASE WHEN d.kind <> 'delete' THEN d.{quote(k)} END"
    changed = [
        f"CASE WHEN {old[c]} IS DISTINCT FROM {new[c]} THEN {literal(c)} END"
        for c in columns
        if c not in keys
    ]
    order = []
    if config.updated_at:
        order = [f"{new[config.updated_at]} NULLS LAST", f"{old[config.updated_at]} NULLS LAST"]
    return sql.load("select_changes_fetched").format(
        order=", ".join([*order, f"{object_key} NULLS LAST"]),
        object_key=object_key,
        changed=f"[{', '.join(changed)}]" if changed else "CAST([] AS VARCHAR[])",
        values=", ".join(
            f"{old[c]} AS {quote('old_' + c)}, {new[c]} AS {quote('new_' + c)}" for c in columns
        ),
        fetched_join=_key_join(keys, "f", "d"),
        old_join=_key_join(keys, "o", "d"),
        diff_keys=", ".join(f"d.{quote(k)}" for k in keys),
        ordered_join=_key_join(keys, "r", "d"),
    )


def _select_list(
    config: SourceBase, columns: list[str], *, types: dict[str, str] | None = None
) -> str:
    # JSON columns travel as text in Arrow and are cast on the way in.
    types = types or {name: spec.type for name, spec in config.columns.items()}
    return ", ".join(
        f"CAST({quote(c)} AS JSON)" if types.get(c) == "json" else quote(c) for c in columns
    )


def _key_join(keys: list[str], left: str = "t", right: str = "s") -> str:
    return " AND ".join(f"{left}.{quote(k)} = {right}.{quote(k)}" for k in keys)


def _next_cursor(before: str | None, newest: datetime | None) -> str | None:
    """The newest updated-at seen so far (``newest``: this walk's, None for none or no
    updated-at): the cursor never moves backwards."""
    if newest is None:
        return before
    candidate = format_cursor(newest)
    if before is None:
        return candidate
    return max(before, candidate, key=lambda c: datetime.fromisoformat(c))


def _count(wh: Warehouse, config: SourceBase) -> int:
    if (scope := config.target_scope) is not None:
        statement = render(
            "count_entity_target", wh.dialect, table=quote(config.table), column=quote(scope.column)
        )
        return wh.fetch(statement, (scope.value,))[0][0]
    return wh.fetch(render("count_entity", wh.dialect, table=quote(config.table)))[0][0]


def _finish_params(stats: SyncStats, finished_at: datetime, error: str | None) -> tuple:
    return (
        stats.sync_id,
        finished_at,
        stats.status,
        stats.pages,
        stats.requests,
        stats.rows_fetched,
        stats.inserted,
        stats.updated,
        stats.deleted,
        stats.unchanged,
        stats.cursor_after,
        error,
        stats.silent,
        stats.storm_held,
        stats.not_modified,
        stats.rows_duplicate,
    )


def _record_failure(wh: Warehouse, stats: SyncStats, error: BaseException) -> None:
    """Mark the attempt failed; the data transaction already rolled back."""
    stats.status = "failed"
    message = f"{type(error).__name__}: {error}"[:2000]
    try:
        with wh.transaction():
            wh.execute(
                render("finish_sync_runs", wh.dialect),
                _finish_params(stats, datetime.now(UTC), message),
            )
    except Exception:  # noqa: BLE001 - the original error matters more than the bookkeeping
        pass


# Column names the sync adds to every source table, for readers of the tables.
BOOKKEEPING_COLUMNS = (HASH_COLUMN, SYNCED_AT_COLUMN, RAW_COLUMN, RAW_HASH_COLUMN)


def held_changes(wh: Warehouse, config: SourceBase) -> int:
    """How many of the source's changes wait for a release after a change storm."""
    changes = quote(changes_table(config.table))
    return wh.fetch(render("count_changes_held", wh.dialect, changes=changes))[0][0]


def release_changes(wh: Warehouse, config: SourceBase, *, discard: bool = False) -> int:
    """Release held changes to the watches (or, with ``discard``, mark them silent).

    Returns how many changes were settled.
    """
    changes = quote(changes_table(config.table))
    with wh.transaction():
        if discard:
            rows = wh.fetch(render("update_changes_discard", wh.dialect, changes=changes))
        else:
            rows = wh.fetch(
                render("update_changes_release", wh.dialect, changes=changes), (datetime.now(UTC),)
            )
    return len(rows)
