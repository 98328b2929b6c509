-- Records the outcomes of one claimed batch, in one statement; only the claimant (status
-- 'sending') may, so a delivery parked or requeued meanwhile keeps that state.
UPDATE deliveries AS d
SET status = s.status,
    delivered_at = s.delivered_at,
    next_attempt_at = s.next_attempt_at,
    last_error = s.last_error
FROM {stage} AS s
WHERE d.notification_id = s.notification_id AND d.channel = s.channel AND d.status = 'sending'
