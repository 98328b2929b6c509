-- Claims one dead-lettered delivery for `changewatch redeliver`, right before its one send.
-- Only from 'dead': a second redeliver (or one racing it) finds it claimed or sent, so each
-- goes once per command.
UPDATE deliveries
SET status = 'sending', claimed_at = $1, attempts = attempts + 1
WHERE notification_id = $2 AND channel = $3 AND status = 'dead'
RETURNING attempts
