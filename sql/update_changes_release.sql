-- Releases held changes: evaluations pick them up on their next run.
UPDATE {changes} SET held = FALSE, released_at = $1 WHERE held
RETURNING change_id
