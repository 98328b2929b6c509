-- PostgreSQL (pipeline/webhooks/webhook_inbox_postgres.py). Idempotent: a delivery stored before (a provider's
-- retry) inserts nothing and returns no row, which tells the receiver which answer to give.
INSERT INTO changewatch_webhook_inbox (source, delivery_id, provider, event, received_at, body)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (source, delivery_id) DO NOTHING
RETURNING seq
