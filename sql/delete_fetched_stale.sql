-- Stage of a sync (DuckDB, not transpiled: it never runs in the warehouse). An object seen twice
-- in one walk (it moved between pages, or changed while the walk went on) keeps its newest
-- version by updated-at, then arrival: each key is written once. Its copies may be in `fetched`
-- or in `seen` (see insert_seen_batch.sql): {table} is one of them, `walked` both. Only the
-- key, updated-at and arrival columns are sorted, never the wide rows.
DELETE FROM {table} WHERE _arrival IN (
    SELECT _arrival FROM (
        SELECT _arrival, row_number() OVER (PARTITION BY {keys} ORDER BY {order}) AS n
        FROM walked
    ) WHERE n > 1
)
