-- Written in the same transaction as the rows and changes it covers: the cursor can never run
-- ahead of the data (a crash before commit leaves both where they were).
INSERT INTO sync_state (source, table_name, cursor_value, last_sync_id, last_synced_at, row_count)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (source) DO UPDATE SET
    table_name = EXCLUDED.table_name,
    cursor_value = EXCLUDED.cursor_value,
    last_sync_id = EXCLUDED.last_sync_id,
    last_synced_at = EXCLUDED.last_synced_at,
    row_count = EXCLUDED.row_count
