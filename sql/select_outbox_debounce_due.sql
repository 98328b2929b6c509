-- A debounced watch's notifications whose window has ended ($4 = now), unsettled, with what
-- decides them: a later change of the object the watch notified about (or found a duplicate)
-- inside the window supersedes one; else the object's state when the window ended
-- (state_hash, NULL when deleted) is compared with its state before the burst (base_hash):
-- the changes notified about, each within the debounce ($3 seconds) of the one before.
WITH waiting AS (
    SELECT o.notification_id, o.object_key, o.change_id, o.due_at
    FROM outbox AS o
    WHERE o.watch = $1 AND o.source = $2 AND o.due_at IS NOT NULL AND o.settled_at IS NULL
      AND o.due_at <= $4
),
notified AS (
    SELECT e.object_key, e.change_id, c.detected_at, c.old_hash,
           CASE
               -- A notification already released ends its burst: what it said was sent.
               WHEN lag(o.notification_id IS NOT NULL AND o.suppressed IS NULL
                        AND (o.due_at IS NULL OR o.settled_at IS NOT NULL))
                    OVER (PARTITION BY e.object_key ORDER BY e.change_id)
               THEN 1
               WHEN lag(c.detected_at) OVER (PARTITION BY e.object_key ORDER BY e.change_id)
                    >= c.detected_at - CAST($3 AS DOUBLE PRECISION) * INTERVAL '1 second'
               THEN 0 ELSE 1
           END AS opens
    FROM evaluations AS e
    JOIN {changes} AS c ON c.change_id = e.change_id
    LEFT JOIN outbox AS o ON o.watch = $1 AND o.source = $2 AND o.change_id = e.change_id
    WHERE e.watch = $1 AND e.source = $2 AND e.decision IN ('notify', 'duplicate')
      AND e.object_key IN (SELECT object_key FROM waiting)
),
bursts AS (
    SELECT object_key, change_id, detected_at, old_hash,
           sum(opens) OVER (PARTITION BY object_key ORDER BY change_id) AS burst
    FROM notified
)
SELECT w.notification_id, w.object_key, w.change_id, w.due_at,
       (SELECT min(n.change_id) FROM notified AS n
        WHERE n.object_key = w.object_key AND n.change_id > w.change_id
          AND n.detected_at <= w.due_at) AS superseded_by,
       (SELECT b.old_hash FROM bursts AS b
        WHERE b.object_key = w.object_key
          AND b.burst = (SELECT m.burst FROM bursts AS m
                         WHERE m.object_key = w.object_key AND m.change_id = w.change_id)
        ORDER BY b.change_id LIMIT 1) AS base_hash,
       (SELECT c.new_hash FROM {changes} AS c
        WHERE c.object_key = w.object_key AND c.detected_at <= w.due_at
        ORDER BY c.change_id DESC LIMIT 1) AS state_hash
FROM waiting AS w
ORDER BY w.due_at, w.notification_id
