-- One row per (watch, source): the change_id up to which the watch has evaluated the
-- source's change log. Written in the same transaction as the evaluations it covers.
CREATE TABLE IF NOT EXISTS watch_state (
    watch TEXT NOT NULL,
    source TEXT NOT NULL,
    last_change_id BIGINT NOT NULL,
    condition_version TEXT,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (watch, source)
)
