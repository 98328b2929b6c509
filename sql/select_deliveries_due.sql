-- Deliveries whose time has come, in the order their changes happened (creation, then the
-- source's change id), so the notifications about one object go out in order whenever they
-- are due together.
SELECT d.notification_id, d.channel FROM deliveries AS d
JOIN outbox AS o ON o.notification_id = d.notification_id
WHERE d.status = 'pending' AND d.next_attempt_at <= $1
ORDER BY o.created_at, o.change_id, d.notification_id, d.channel
