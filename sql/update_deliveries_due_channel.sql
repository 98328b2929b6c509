-- A channel came back (its probe got through, or a person resumed it): the retries that were
-- waiting for it are due now, so the queue drains at once and in order.
UPDATE deliveries SET next_attempt_at = $2
WHERE channel = $1 AND status = 'pending' AND next_attempt_at > $2
