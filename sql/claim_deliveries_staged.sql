-- Claims one batch of deliveries right before it is sent, in its own transaction: a crash
-- leaves at most this batch 'sending' (parked later, never repeated) and the rest untouched.
-- The status check makes the claim atomic: of two deliverers racing on Postgres, one gets
-- each row.
UPDATE deliveries AS d
SET status = 'sending', claimed_at = $1, attempts = d.attempts + 1
FROM {stage} AS s
WHERE d.notification_id = s.notification_id AND d.channel = s.channel AND d.status = 'pending'
RETURNING d.notification_id, d.channel, d.attempts
