-- What people said about notifications they got: one row per notification, the latest word
-- wins. Exported as labelled examples for the eval harness (`changewatch eval`).
CREATE TABLE IF NOT EXISTS feedback (
    notification_id TEXT PRIMARY KEY,
    -- useful | noise
    verdict TEXT NOT NULL,
    note TEXT,
    recorded_at TIMESTAMPTZ NOT NULL
)
