-- Every decision about every change, per watch, in one place: the filter, the judge's
-- verdict (cached or not), the dedupe key and each delivery. `changewatch explain` reads it.
-- Deliveries belong to the evaluation that created the notification; a duplicate shows the
-- notification that suppressed it, not that notification's deliveries. A debounced notification
-- shows when its window ended (debounced_until), why it was suppressed, if it was, and the
-- change it stands for when a later change took it over within the window.
CREATE OR REPLACE VIEW decisions AS
SELECT e.watch, e.source, e.object_key, e.change_id, e.kind, e.evaluated_at,
       e.passed_filter, e.filter_error, e.decision,
       e.should_notify, e.confidence, e.urgency, e.summary, e.reasoning,
       e.model, e.cache_hit, e.judge_error,
       e.notification_id, o.dedupe_key, o.title, o.created_at AS notified_at,
       o.change_id AS notified_change_id, o.due_at AS debounced_until, o.suppressed,
       d.channel, d.status AS delivery_status, d.attempts, d.delivered_at, d.last_error
FROM evaluations AS e
LEFT JOIN outbox AS o ON o.notification_id = e.notification_id
LEFT JOIN deliveries AS d ON d.notification_id = e.notification_id AND e.decision = 'notify'
