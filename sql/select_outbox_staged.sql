SELECT o.* FROM outbox AS o JOIN {stage} AS s ON o.notification_id = s.notification_id
