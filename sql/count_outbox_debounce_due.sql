-- How many of a debounced watch's notifications from one source wait to be settled at $3:
-- none means nothing to read (the source's change log may not even exist yet).
SELECT count(*) FROM outbox
WHERE watch = $1 AND source = $2 AND due_at IS NOT NULL AND settled_at IS NULL AND due_at <= $3
