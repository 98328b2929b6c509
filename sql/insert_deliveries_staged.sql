-- One delivery per (notification, channel): pending from its creation, or 'debounced' until
-- its debounce window ends (next_attempt_at); re-inserting is a no-op.
INSERT INTO deliveries (notification_id, channel, status, attempts, next_attempt_at)
SELECT notification_id, channel, status, 0, next_attempt_at FROM {stage}
ON CONFLICT (notification_id, channel) DO NOTHING
