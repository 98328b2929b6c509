-- Claims one batch of deliveries to a channel that takes a batch in one write (a file), in its
-- own transaction right before the write; their outcomes are recorded together after it. The
-- status check makes the claim atomic: of two deliverers racing on Postgres, one gets each
-- row. last_error tells a delivery requeued after a crash, whose line may already be written.
UPDATE deliveries AS d
SET status = 'sending', claimed_at = $1, attempts = d.attempts + 1
FROM {stage} AS s
WHERE d.notification_id = s.notification_id AND d.channel = s.channel AND d.status = 'pending'
RETURNING d.notification_id, d.channel, d.attempts, d.last_error
