-- The deliveries of settled notifications: pending (due now: the window has ended) or
-- suppressed, never sent, with the reason. Only from 'debounced', so a second pass is a no-op.
UPDATE deliveries AS d
SET status = CASE WHEN s.suppressed IS NULL THEN 'pending' ELSE 'suppressed' END,
    last_error = s.suppressed
FROM {stage} AS s
WHERE d.notification_id = s.notification_id AND d.status = 'debounced'
