-- The other deliveries still 'sending' past the claim lease (run after requeue_deliveries):
-- to a channel that delivers at most once (email, apprise, console), or out of attempts. It
-- may have arrived, so it is parked as dead with the reason ($2), for a person to look at.
UPDATE deliveries
SET status = 'dead', last_error = $2
WHERE status = 'sending' AND claimed_at < $1
RETURNING notification_id, channel
