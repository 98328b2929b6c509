-- The watermark only moves forward, even if an older run commits after a newer one.
INSERT INTO watch_state (watch, source, last_change_id, condition_version, updated_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (watch, source) DO UPDATE SET
    last_change_id = greatest(watch_state.last_change_id, EXCLUDED.last_change_id),
    condition_version = EXCLUDED.condition_version,
    updated_at = EXCLUDED.updated_at
