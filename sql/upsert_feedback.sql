-- Keyed by the notification: saying it twice (or changing one's mind) keeps one row.
INSERT INTO feedback (notification_id, verdict, note, recorded_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (notification_id) DO UPDATE SET
    verdict = EXCLUDED.verdict,
    note = EXCLUDED.note,
    recorded_at = EXCLUDED.recorded_at
