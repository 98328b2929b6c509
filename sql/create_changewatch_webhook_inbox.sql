-- PostgreSQL: the webhook inbox (pipeline/webhooks/webhook_inbox_postgres.py) when several hosts share it, in
-- Dagster's own database by default. The same columns as the SQLite file's webhook_inbox.
-- UNIQUE (source, delivery_id): a provider's retry of a stored delivery adds nothing.
-- An identity column's sequence is never reused after pruning, so the sensor's cursor (the
-- last seq it saw) never skips a new delivery.
CREATE TABLE IF NOT EXISTS changewatch_webhook_inbox (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    event TEXT,
    received_at DOUBLE PRECISION NOT NULL,
    body BYTEA NOT NULL,
    consumed_at DOUBLE PRECISION,
    consumed_by TEXT,
    UNIQUE (source, delivery_id)
)
