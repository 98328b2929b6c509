-- A delivery still 'sending' past the claim lease belongs to a process that died during the
-- send: it may or may not have arrived. To a channel whose receiver recognises a repeat ($4:
-- a webhook's `webhook-id`, a file line's notification id) it is sent again, due at once
-- ($2), marked with $3 so the file channel first looks for the line; while attempts remain.
UPDATE deliveries
SET status = 'pending', next_attempt_at = $2, last_error = $3
WHERE status = 'sending' AND claimed_at < $1 AND attempts < $5
  AND channel IN (SELECT unnest(CAST($4 AS TEXT[])))
RETURNING notification_id, channel
