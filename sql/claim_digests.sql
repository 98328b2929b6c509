-- Claims a digest window before sending. The primary key makes a second claim of a window
-- that was sent (or is being sent) a no-op, so a re-run or a backfill never sends it twice;
-- only a window whose send definitely failed can be claimed again.
INSERT INTO digests (digest, window_start, window_end, status, item_count, claimed_at)
VALUES ($1, $2, $3, 'sending', $4, $5)
ON CONFLICT (digest, window_start) DO UPDATE SET
    status = 'sending', item_count = EXCLUDED.item_count, claimed_at = EXCLUDED.claimed_at
WHERE digests.status = 'failed'
RETURNING digest
