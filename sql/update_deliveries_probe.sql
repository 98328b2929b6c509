-- The delivery a paused channel is probed with is due now, whatever its own schedule said: the
-- probe tests the channel. Only while pending, so a second deliverer's probe is a no-op.
UPDATE deliveries SET next_attempt_at = $3
WHERE notification_id = $1 AND channel = $2 AND status = 'pending'
