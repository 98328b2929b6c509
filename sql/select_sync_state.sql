SELECT cursor_value, row_count, last_sync_id FROM sync_state WHERE source = $1
