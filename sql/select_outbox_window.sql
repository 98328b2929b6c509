-- The notifications of some watches in [start, end), for a digest: a debounced one belongs to
-- the window its debounce ended in, and only once settled and not suppressed (a flap never
-- reaches a digest).
SELECT * FROM outbox
WHERE coalesce(due_at, created_at) >= $1 AND coalesce(due_at, created_at) < $2
  AND watch IN (SELECT unnest(CAST($3 AS TEXT[])))
  AND (due_at IS NULL OR (settled_at IS NOT NULL AND suppressed IS NULL))
ORDER BY watch, created_at DESC
