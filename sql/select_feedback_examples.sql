-- A watch's notifications that people rated, with what the notification showed them. The
-- payload is an empty object once retention cleared the notification's content: those cannot be
-- examples any more.
SELECT o.notification_id, o.source, o.object_key, o.kind, o.title, o.url, o.payload,
       f.verdict, f.note
FROM feedback AS f
JOIN outbox AS o ON o.notification_id = f.notification_id
WHERE o.watch = $1 AND o.payload <> '{{}}'
ORDER BY f.recorded_at, o.notification_id
