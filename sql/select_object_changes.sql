-- One object's changes in a source's change log, oldest first, with what the watch decided
-- about each (nothing yet for changes above its watermark).
SELECT c.change_id, c.kind, c.detected_at, c.changed_columns, c.silent, c.held,
       d.evaluated_at, d.passed_filter, d.filter_error, d.decision, d.should_notify,
       d.confidence, d.summary, d.reasoning, d.model, d.cache_hit, d.judge_error,
       d.notification_id, d.dedupe_key, d.notified_change_id, d.debounced_until, d.suppressed,
       d.channel, d.delivery_status, d.attempts,
       d.delivered_at, d.last_error
FROM {changes} AS c
LEFT JOIN decisions AS d
  ON d.watch = $1 AND d.source = $2 AND d.change_id = c.change_id
WHERE c.object_key = $3
ORDER BY c.change_id, d.channel
