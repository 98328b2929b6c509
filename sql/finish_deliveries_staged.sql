-- Records the outcomes of one claimed batch, in one statement; only the claimant (status
-- 'sending') may, so a delivery parked as dead meanwhile stays dead. A delivery handed back
-- unsent (status 'pending' without an error) keeps the last error it had.
UPDATE deliveries AS d
SET status = s.status,
    attempts = s.attempts,
    delivered_at = s.delivered_at,
    next_attempt_at = s.next_attempt_at,
    last_error = CASE
        WHEN s.status = 'pending' THEN coalesce(s.last_error, d.last_error)
        ELSE s.last_error
    END
FROM {stage} AS s
WHERE d.notification_id = s.notification_id AND d.channel = s.channel AND d.status = 'sending'
