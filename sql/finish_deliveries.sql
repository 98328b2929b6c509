-- Records the outcome of one claimed send as soon as it is known; only the claimant (status
-- 'sending') may, so a delivery parked or requeued meanwhile keeps that state.
UPDATE deliveries
SET status = $3, delivered_at = $4, next_attempt_at = $5, last_error = $6
WHERE notification_id = $1 AND channel = $2 AND status = 'sending'
