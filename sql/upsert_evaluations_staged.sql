-- Re-evaluating a change (a held one, or a re-run after a crash) replaces its row: keyed by
-- (watch, source, change_id), never duplicated.
INSERT INTO evaluations (watch, source, change_id, object_key, kind, content_hash,
                         passed_filter, decision, should_notify, urgency, summary, reasoning,
                         confidence, model, judge_version, judge_error, filter_error, cache_hit,
                         prompt_tokens, completion_tokens, latency_ms, notification_id,
                         evaluated_at)
SELECT watch, source, change_id, object_key, kind, content_hash, passed_filter, decision,
       should_notify, urgency, summary, reasoning, confidence, model, judge_version,
       judge_error, filter_error, cache_hit, prompt_tokens, completion_tokens, latency_ms,
       notification_id, evaluated_at
FROM {stage}
ON CONFLICT (watch, source, change_id) DO UPDATE SET
    passed_filter = EXCLUDED.passed_filter,
    decision = EXCLUDED.decision,
    should_notify = EXCLUDED.should_notify,
    urgency = EXCLUDED.urgency,
    summary = EXCLUDED.summary,
    reasoning = EXCLUDED.reasoning,
    confidence = EXCLUDED.confidence,
    model = EXCLUDED.model,
    judge_version = EXCLUDED.judge_version,
    judge_error = EXCLUDED.judge_error,
    filter_error = EXCLUDED.filter_error,
    cache_hit = EXCLUDED.cache_hit,
    prompt_tokens = EXCLUDED.prompt_tokens,
    completion_tokens = EXCLUDED.completion_tokens,
    latency_ms = EXCLUDED.latency_ms,
    notification_id = EXCLUDED.notification_id,
    evaluated_at = EXCLUDED.evaluated_at
