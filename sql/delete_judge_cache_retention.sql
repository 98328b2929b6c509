-- Retention: verdicts cached before $1. Identical content met again is judged again.
DELETE FROM judge_cache WHERE created_at < $1
RETURNING content_hash
