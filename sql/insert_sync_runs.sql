-- Recorded before fetching, in its own transaction, so a crashed sync still leaves a trace.
-- Idempotent on sync_id: a retried step re-uses its id and inserts nothing new.
INSERT INTO sync_runs (sync_id, source, dagster_run_id, started_at, status, cursor_before)
VALUES ($1, $2, $3, $4, 'running', $5)
ON CONFLICT (sync_id) DO NOTHING
