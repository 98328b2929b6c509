UPDATE digests SET status = $3, sent_at = $4, message_id = $5, error = $6
WHERE digest = $1 AND window_start = $2
