-- Claims one delivery right before its send, in its own transaction: a crash leaves at most
-- this one 'sending' (parked later, never repeated) and the rest untouched. The status check
-- makes the claim atomic: of two deliverers racing on Postgres, one gets the row.
UPDATE deliveries
SET status = 'sending', claimed_at = $1, attempts = attempts + 1
WHERE notification_id = $2 AND channel = $3 AND status = 'pending'
RETURNING attempts
