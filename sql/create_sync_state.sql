-- One row per source: the cursor and bookkeeping that must move together with the rows they
-- describe. It is only ever written inside the transaction that writes the source's rows.
CREATE TABLE IF NOT EXISTS sync_state (
    source TEXT PRIMARY KEY,
    table_name TEXT NOT NULL,
    cursor_value TEXT,
    last_sync_id TEXT,
    last_synced_at TIMESTAMPTZ,
    row_count BIGINT
)
