-- A source's change log: one row per insert, update or delete, with typed old and new values
-- of every declared column, so change filters are plain SQL over one table.
CREATE TABLE IF NOT EXISTS {changes} (
    -- Given by the sync that records the change: the log's highest id + 1, in the sync's
    -- order, under the source's sync lock (syncs of a source never overlap).
    change_id BIGINT PRIMARY KEY,
    sync_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    object_key TEXT NOT NULL,
    old_hash TEXT,
    new_hash TEXT,
    changed_columns TEXT[],
    detected_at TIMESTAMPTZ NOT NULL,
    -- Recorded but never evaluated: a silent baseline or a silent backfill.
    silent BOOLEAN NOT NULL DEFAULT FALSE,
    -- Waiting for `changewatch release`: the sync that made it looked like a change storm.
    held BOOLEAN NOT NULL DEFAULT FALSE,
    released_at TIMESTAMPTZ,
    {value_defs}
)
