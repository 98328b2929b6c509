-- Verdicts by what was judged: the same content under the same condition and model is never
-- sent to the model twice. Written right after each call, in its own transaction, so a crash
-- before the evaluation commits does not cost a second call.
CREATE TABLE IF NOT EXISTS judge_cache (
    watch TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    judge_version TEXT NOT NULL,
    model TEXT NOT NULL,
    should_notify BOOLEAN NOT NULL,
    urgency TEXT NOT NULL,
    summary TEXT NOT NULL,
    reasoning TEXT NOT NULL,
    confidence DOUBLE PRECISION NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    latency_ms INTEGER,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (watch, content_hash, judge_version, model)
)
