-- SQLite (pipeline/webhooks/webhook_inbox.py). After a sync of the source committed: the deliveries it covered
-- (received before it began) are done. Only the first sync to cover one marks it.
UPDATE webhook_inbox
SET consumed_at = ?, consumed_by = ?
WHERE source = ? AND seq <= ? AND consumed_at IS NULL
