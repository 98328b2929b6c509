-- SQLite (pipeline/webhooks/webhook_inbox.py). Idempotent: a delivery stored before (a provider's retry) inserts
-- nothing, and the row count tells the receiver which answer to give.
INSERT INTO webhook_inbox (source, delivery_id, provider, event, received_at, body)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (source, delivery_id) DO NOTHING
