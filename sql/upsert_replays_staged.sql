-- Keyed by (replay_version, watch, source, change_id): a replay run twice keeps one row each.
INSERT INTO replays (replay_version, watch, source, change_id, object_key, kind, sent,
                     would_send, outcome, reason, where_text, condition_text, replayed_at)
SELECT replay_version, watch, source, change_id, object_key, kind, sent, would_send, outcome,
       reason, where_text, condition_text, replayed_at
FROM {stage}
ON CONFLICT (replay_version, watch, source, change_id) DO UPDATE SET
    sent = EXCLUDED.sent,
    would_send = EXCLUDED.would_send,
    outcome = EXCLUDED.outcome,
    reason = EXCLUDED.reason,
    replayed_at = EXCLUDED.replayed_at
