-- The deliveries of revived notifications (now standing for the stage's change, unsettled)
-- wait out their new window; none was ever sent.
UPDATE deliveries AS d
SET status = 'debounced', next_attempt_at = s.due_at, last_error = NULL
FROM {stage} AS s, outbox AS o
WHERE d.notification_id = s.notification_id AND d.status IN ('debounced', 'suppressed')
  AND o.notification_id = s.notification_id AND o.change_id = s.change_id
  AND o.settled_at IS NULL
