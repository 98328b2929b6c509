-- Records the outcomes of one claimed batch, in one statement; only the claimant (status
-- 'sending') may, so a delivery parked as dead meanwhile stays dead. A delivery handed back
-- unsent returns to pending as it was before the claim: same due time, same last error.
UPDATE deliveries AS d
SET status = s.status,
    attempts = s.attempts,
    delivered_at = s.delivered_at,
    next_attempt_at = CASE WHEN s.handed_back THEN d.next_attempt_at ELSE s.next_attempt_at END,
    last_error = CASE WHEN s.handed_back THEN d.last_error ELSE s.last_error END
FROM {stage} AS s
WHERE d.notification_id = s.notification_id AND d.channel = s.channel AND d.status = 'sending'
