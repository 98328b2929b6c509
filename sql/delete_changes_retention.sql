-- Retention: change-log entries older than $1 that nothing needs any more. Kept are entries
-- above $2 (the lowest watermark of the source's watches $4, $5 of them), ones the storm
-- guard holds, ones a watch holds (judge unavailable, filter failed: evaluations $3 retries),
-- released ones until their release is older than $1 and every watch has evaluated them,
-- and always the newest entry: the next sync numbers its changes from it.
DELETE FROM {changes}
WHERE detected_at < $1
  AND coalesce(released_at, detected_at) < $1
  AND change_id <= $2
  AND NOT held
  AND change_id < (SELECT max(n.change_id) FROM {changes} AS n)
  AND change_id NOT IN (
      SELECT e.change_id FROM evaluations AS e
      WHERE e.source = $3 AND e.decision IN ('held', 'filter_error')
  )
  AND (
      released_at IS NULL
      OR (
          SELECT count(DISTINCT e.watch) FROM evaluations AS e
          WHERE e.source = $3 AND e.change_id = {changes}.change_id AND e.watch = ANY($4)
      ) >= $5
  )
RETURNING change_id
