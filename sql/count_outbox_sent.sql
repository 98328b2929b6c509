-- Notifications of one watch, or about one source ({column}), delivered on at least one
-- channel since a moment: what `stop.after_notifications` counts. Pending, suppressed and
-- dead ones were never received, so they do not count.
SELECT COUNT(DISTINCT o.notification_id)
FROM outbox AS o
JOIN deliveries AS d ON d.notification_id = o.notification_id
WHERE o.{column} = $1 AND d.status = 'sent' AND d.delivered_at >= $2
