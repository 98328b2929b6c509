-- Notifications still waiting for a debounce their watch no longer has (its `debounce:` was
-- removed, or the watch itself): released at $1 rather than left waiting for good. $2 holds
-- the watches that still debounce.
UPDATE outbox
SET settled_at = $1
WHERE due_at IS NOT NULL AND settled_at IS NULL AND NOT (watch = ANY($2))
RETURNING notification_id
