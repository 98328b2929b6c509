-- A source's recorded changes since a time, each with whether a (possibly edited) filter
-- passes it and what the watch actually decided about it. Silent changes were never
-- evaluated and are skipped here too. The filter runs in the warehouse, as a column.
SELECT c.*, coalesce(({filter}), FALSE) AS _passed, e.decision AS _actual
FROM {changes} AS c
LEFT JOIN evaluations AS e
  ON e.watch = $2 AND e.source = $3 AND e.change_id = c.change_id
WHERE NOT c.silent AND c.detected_at >= $1
ORDER BY c.change_id
