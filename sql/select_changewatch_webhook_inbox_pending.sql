-- PostgreSQL (pipeline/webhooks/webhook_inbox_postgres.py). Deliveries after the sensor's cursor that no sync
-- has covered yet, oldest first and bounded, so one tick stays cheap however many arrived.
SELECT seq, source, delivery_id
FROM changewatch_webhook_inbox
WHERE seq > $1 AND consumed_at IS NULL
ORDER BY seq
LIMIT $2
