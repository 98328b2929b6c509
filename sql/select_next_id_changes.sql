-- The first change_id a sync gives out: one past the log's highest (read under the sync lock,
-- so ids only grow, and a sync's changes read in its order).
SELECT coalesce(max(change_id), 0) + 1 FROM {changes}
