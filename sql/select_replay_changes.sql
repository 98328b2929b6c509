-- A source's recorded changes since a time, each with whether a (possibly edited) filter
-- passes it, what the watch actually decided about it, and whether its notification was
-- then suppressed by the watch's debounce (a flap, or superseded by a later change of the
-- burst: the notification moved on, so no unsuppressed row points at this change).
-- Silent changes were never evaluated and are skipped here too. The filter runs in the
-- warehouse, as a column.
SELECT c.*, coalesce(({filter}), FALSE) AS _passed, e.decision AS _actual,
       e.decision = 'notify' AND NOT EXISTS (
           SELECT 1 FROM outbox AS o
           WHERE o.watch = $2 AND o.change_id = c.change_id AND o.suppressed IS NULL
       ) AS _suppressed
FROM {changes} AS c
LEFT JOIN evaluations AS e
  ON e.watch = $2 AND e.source = $3 AND e.change_id = c.change_id
WHERE NOT c.silent AND c.detected_at >= $1
ORDER BY c.change_id
