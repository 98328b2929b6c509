-- A delivery still 'sending' long after it was claimed belongs to a process that died during
-- the send. It may or may not have arrived; retrying could deliver it twice, so it is parked
-- as dead, with a reason, for a person to look at.
UPDATE deliveries
SET status = 'dead', last_error = 'interrupted while sending; not retried so it cannot arrive twice'
WHERE status = 'sending' AND claimed_at < $1
RETURNING notification_id
