-- Retention: the content of notifications created before $1 whose every delivery is over
-- (sent, dead-lettered or suppressed by debounce). The row and its dedupe key stay, so nothing is ever sent twice.
-- $2 and $3 choose the watches: those in $2 when $3 is true, all the others when false.
UPDATE outbox
SET title = '', body = '', url = NULL, summary = NULL, payload = '{{}}'
WHERE coalesce(due_at, created_at) < $1
  AND (watch = ANY($2)) = $3
  AND payload <> '{{}}'
  AND NOT EXISTS (
      SELECT 1 FROM deliveries AS d
      WHERE d.notification_id = outbox.notification_id AND d.status NOT IN ('sent', 'dead', 'suppressed')
  )
RETURNING notification_id
