-- Closes a sync's record; for a success this runs in the same transaction as the rows.
UPDATE sync_runs
SET finished_at = $2, status = $3, pages = $4, requests = $5, rows_fetched = $6,
    inserted = $7, updated = $8, deleted = $9, unchanged = $10, cursor_after = $11, error = $12,
    silent = $13, storm_held = $14, not_modified = $15, rows_duplicate = $16
WHERE sync_id = $1
