-- Claims one delivery right before its send, in its own transaction, so a crash leaves at most
-- the message in flight 'sending'. The status check makes the claim atomic: of two deliverers
-- racing on Postgres, one gets the row; the due check keeps a retry waiting for its backoff.
UPDATE deliveries
SET status = 'sending', claimed_at = $1, attempts = attempts + 1
WHERE notification_id = $2 AND channel = $3 AND status = 'pending' AND next_attempt_at <= $1
RETURNING attempts, last_error
