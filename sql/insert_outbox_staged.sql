-- Insert-if-absent on the data-derived key: a notification exists at most once.
INSERT INTO outbox (notification_id, dedupe_key, watch, source, object_key, kind, change_id,
                    title, body, url, urgency, summary, payload, created_at, due_at,
                    changed_at)
SELECT notification_id, dedupe_key, watch, source, object_key, kind, change_id, title, body,
       url, urgency, summary, payload, created_at, due_at, changed_at
FROM {stage}
ON CONFLICT DO NOTHING
