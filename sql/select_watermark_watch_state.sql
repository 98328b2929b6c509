-- How far every watch of a source has got: the lowest watermark among the named watches
-- (NULL when none of them has run yet).
SELECT min(last_change_id) FROM watch_state WHERE source = $1 AND watch = ANY($2)
