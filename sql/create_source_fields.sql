-- The top-level payload fields seen per source, so a field that appears later is noticed.
CREATE TABLE IF NOT EXISTS source_fields (
    source TEXT NOT NULL,
    field TEXT NOT NULL,
    field_type TEXT,
    -- baseline (seen on the first sync) | evolved (became a column) | discarded (raw only)
    action TEXT NOT NULL,
    first_seen_at TIMESTAMPTZ NOT NULL,
    sync_id TEXT NOT NULL,
    PRIMARY KEY (source, field)
)
