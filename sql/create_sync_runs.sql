-- One row per sync attempt, for people and dashboards: what ran, how long, what it did.
CREATE TABLE IF NOT EXISTS sync_runs (
    sync_id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    dagster_run_id TEXT,
    started_at TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ,
    status TEXT NOT NULL,
    pages INTEGER,
    requests INTEGER,
    rows_fetched BIGINT,
    inserted BIGINT,
    updated BIGINT,
    deleted BIGINT,
    unchanged BIGINT,
    cursor_before TEXT,
    cursor_after TEXT,
    silent BOOLEAN,
    storm_held BOOLEAN,
    not_modified BOOLEAN,
    -- Records whose key came again in the same sync, merged into one row (see keep_newest).
    rows_duplicate BIGINT,
    error TEXT
)
