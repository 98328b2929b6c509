-- A source's table: one row per external object, its declared columns typed, plus bookkeeping.
-- _raw_hash is the hash of _raw as a sync computed it (NULL: not known yet, the next sync
-- stores it).
CREATE TABLE IF NOT EXISTS {table} (
    {column_defs},
    _content_hash TEXT NOT NULL,
    _synced_at TIMESTAMPTZ NOT NULL,
    _raw JSON,
    _raw_hash BIGINT,
    PRIMARY KEY ({primary_key})
)
