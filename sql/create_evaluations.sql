-- One row per (watch, change): what the filter and the judge said about it. A held change is
-- re-evaluated later and its row updated in place.
CREATE TABLE IF NOT EXISTS evaluations (
    watch TEXT NOT NULL,
    source TEXT NOT NULL,
    change_id BIGINT NOT NULL,
    object_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    content_hash TEXT,
    passed_filter BOOLEAN NOT NULL,
    -- notify | skip (filter or judge said no) | held (judge unavailable, retried later)
    -- | dropped (judge unavailable, policy drop) | duplicate (already notified)
    -- | filter_error (the filter failed on this change's values; retried every run)
    decision TEXT NOT NULL,
    should_notify BOOLEAN,
    urgency TEXT,
    summary TEXT,
    reasoning TEXT,
    confidence DOUBLE PRECISION,
    model TEXT,
    judge_version TEXT,
    judge_error TEXT,
    filter_error TEXT,
    cache_hit BOOLEAN,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    latency_ms INTEGER,
    notification_id TEXT,
    evaluated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (watch, source, change_id)
)
