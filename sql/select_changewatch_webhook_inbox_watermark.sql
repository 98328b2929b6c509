-- PostgreSQL (pipeline/webhooks/webhook_inbox_postgres.py). The last delivery of a source received so far: a
-- sync that starts fetching after it covers it (the UNIQUE index leads with source).
SELECT coalesce(max(seq), 0) FROM changewatch_webhook_inbox WHERE source = $1
