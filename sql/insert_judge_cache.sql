-- Idempotent: a verdict for the same (watch, content, judge version, model) is kept once.
INSERT INTO judge_cache (watch, content_hash, judge_version, model, should_notify, urgency,
                         summary, reasoning, confidence, prompt_tokens, completion_tokens,
                         latency_ms, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (watch, content_hash, judge_version, model) DO NOTHING
