-- A debounced notification whose key comes round again, from a later change, before anything
-- of it was sent (still waiting, or suppressed): it now stands for that change, with its
-- content, and waits out a new window. Never one that was released: a notification goes out
-- at most once. The change_id check makes re-running it a no-op.
UPDATE outbox AS o
SET change_id = s.change_id, kind = s.kind, title = s.title, body = s.body, url = s.url,
    urgency = s.urgency, summary = s.summary, payload = s.payload, due_at = s.due_at,
    changed_at = s.changed_at,
    settled_at = NULL, suppressed = NULL
FROM {stage} AS s
WHERE o.notification_id = s.notification_id AND o.due_at IS NOT NULL
  AND s.due_at IS NOT NULL AND o.change_id < s.change_id
  AND (o.settled_at IS NULL OR o.suppressed IS NOT NULL)
RETURNING o.notification_id
