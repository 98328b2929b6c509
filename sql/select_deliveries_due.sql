-- Deliveries whose time has come, oldest first.
SELECT notification_id, channel FROM deliveries
WHERE status = 'pending' AND next_attempt_at <= $1
ORDER BY next_attempt_at, notification_id, channel
