-- PostgreSQL (pipeline/webhooks/webhook_inbox_postgres.py). Consumed deliveries past their keeping time; a
-- provider retrying one later is stored again and costs one sync that changes nothing.
DELETE FROM changewatch_webhook_inbox WHERE consumed_at < $1
