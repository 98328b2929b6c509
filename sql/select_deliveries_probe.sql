-- The delivery a paused channel is probed with: its oldest pending one, due or not, so the
-- object it is about keeps its order when the channel opens again.
SELECT d.notification_id, d.channel FROM deliveries AS d
JOIN outbox AS o ON o.notification_id = d.notification_id
WHERE d.channel = $1 AND d.status = 'pending'
ORDER BY o.created_at, o.change_id, d.notification_id
LIMIT 1
