SELECT watch FROM outbox WHERE notification_id = $1
