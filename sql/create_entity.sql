-- A source's table: one row per external object, its declared columns typed, plus bookkeeping.
CREATE TABLE IF NOT EXISTS {table} (
    {column_defs},
    _content_hash TEXT NOT NULL,
    _synced_at TIMESTAMPTZ NOT NULL,
    _raw JSON,
    PRIMARY KEY ({primary_key})
)
