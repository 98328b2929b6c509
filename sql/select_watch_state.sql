SELECT last_change_id FROM watch_state WHERE watch = $1 AND source = $2
