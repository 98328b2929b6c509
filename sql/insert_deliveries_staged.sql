-- One pending delivery per (notification, channel); re-inserting is a no-op.
INSERT INTO deliveries (notification_id, channel, status, attempts, next_attempt_at)
SELECT notification_id, channel, 'pending', 0, created_at FROM {stage}
ON CONFLICT (notification_id, channel) DO NOTHING
