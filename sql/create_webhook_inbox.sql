-- SQLite: the webhook inbox (pipeline/webhooks/webhook_inbox.py), a file of its own, never the warehouse: a DuckDB
-- warehouse admits one writing process and runs hold it, while the receiver must answer at once.
-- UNIQUE (source, delivery_id): a provider's retry of a stored delivery adds nothing.
-- AUTOINCREMENT: a seq is never reused after pruning, so the sensor's cursor (the last seq it
-- saw) never skips a new delivery.
CREATE TABLE IF NOT EXISTS webhook_inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    event TEXT,
    received_at REAL NOT NULL,
    body BLOB NOT NULL,
    consumed_at REAL,
    consumed_by TEXT,
    UNIQUE (source, delivery_id)
)
