-- Dead-lettered deliveries for `changewatch redeliver`, in the order of their changes. An
-- empty watch ($1) or channel ($2) matches any; $3: dead-lettered at or after (a dead one's
-- next_attempt_at is when it died).
SELECT d.notification_id, d.channel, o.watch, o.object_key, o.title,
       d.next_attempt_at AS dead_at, d.last_error
FROM deliveries AS d
JOIN outbox AS o ON o.notification_id = d.notification_id
WHERE d.status = 'dead'
  AND ($1 = '' OR o.watch = $1)
  AND ($2 = '' OR d.channel = $2)
  AND d.next_attempt_at >= $3
ORDER BY o.created_at, o.change_id, d.notification_id, d.channel
