-- SQLite (pipeline/webhooks/webhook_inbox.py). Consumed deliveries past their keeping time; a provider retrying
-- one later is stored again and costs one sync that changes nothing.
DELETE FROM webhook_inbox WHERE consumed_at < ?
