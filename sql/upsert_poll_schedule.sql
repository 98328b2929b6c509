-- A row per source, from the newest decision only: a run that carries an older decision
-- (queued longer, or run again) never overwrites a newer one, so replays change nothing.
INSERT INTO poll_schedule (
    source, next_due, interval_s, reason, consecutive_failures, paused, decided_at, updated_at
)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (source) DO UPDATE SET
    next_due = EXCLUDED.next_due,
    interval_s = EXCLUDED.interval_s,
    reason = EXCLUDED.reason,
    consecutive_failures = EXCLUDED.consecutive_failures,
    paused = EXCLUDED.paused,
    decided_at = EXCLUDED.decided_at,
    updated_at = EXCLUDED.updated_at
WHERE EXCLUDED.decided_at >= poll_schedule.decided_at
