-- The deliveries of notifications released because their watch no longer debounces: due at
-- once, not at the end of a window nobody waits for.
UPDATE deliveries AS d
SET status = 'pending', next_attempt_at = least(d.next_attempt_at, o.settled_at)
FROM outbox AS o
WHERE d.notification_id = o.notification_id AND d.status = 'debounced'
  AND o.settled_at IS NOT NULL AND o.suppressed IS NULL
