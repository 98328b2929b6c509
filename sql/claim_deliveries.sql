-- Claims every due delivery. The status check in WHERE makes the claim atomic per row: two
-- deliverers racing on Postgres cannot both claim one delivery.
UPDATE deliveries
SET status = 'sending', claimed_at = $1, attempts = attempts + 1
WHERE status = 'pending' AND next_attempt_at <= $1
RETURNING notification_id, channel, attempts
