-- Settles debounced notifications: released (suppressed NULL) or suppressed with a reason.
-- Only unsettled ones, and only for the window they were decided on (a revival meanwhile
-- opened a new one): settling twice is a no-op.
UPDATE outbox AS o
SET settled_at = s.settled_at, suppressed = s.suppressed
FROM {stage} AS s
WHERE o.notification_id = s.notification_id AND o.settled_at IS NULL AND o.due_at = s.due_at
RETURNING o.notification_id
