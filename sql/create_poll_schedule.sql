-- Where each interval source's polling stands, as the sync sensor decided it: when it is next
-- due, at which interval and why, failed probes in a row, and whether it is paused. The
-- sensor never opens the warehouse (a run may hold a DuckDB file), so runs write these rows
-- from the sensor's run tag; `decided_at` says how current a row is.
CREATE TABLE IF NOT EXISTS poll_schedule (
    source TEXT PRIMARY KEY,
    next_due TIMESTAMPTZ,
    interval_s DOUBLE PRECISION NOT NULL,
    reason TEXT NOT NULL,
    consecutive_failures INTEGER NOT NULL,
    paused BOOLEAN NOT NULL,
    decided_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
)
