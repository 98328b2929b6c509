-- Retention: the evaluations of a source's change-log entries that retention removed (a
-- held or failed one keeps its entry, so it is never among them).
DELETE FROM evaluations
WHERE source = $1
  AND NOT EXISTS (SELECT 1 FROM {changes} AS c WHERE c.change_id = evaluations.change_id)
RETURNING change_id
