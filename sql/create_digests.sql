-- One row per (digest, window): claimed before sending, so a re-run or a backfill of a window
-- never sends a second email.
CREATE TABLE IF NOT EXISTS digests (
    digest TEXT NOT NULL,
    window_start TIMESTAMPTZ NOT NULL,
    window_end TIMESTAMPTZ NOT NULL,
    status TEXT NOT NULL,
    item_count INTEGER NOT NULL,
    message_id TEXT,
    claimed_at TIMESTAMPTZ NOT NULL,
    sent_at TIMESTAMPTZ,
    error TEXT,
    PRIMARY KEY (digest, window_start)
)
