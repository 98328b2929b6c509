-- Idempotent per (watch, content, judge version, model): the latest request's prompt wins (a
-- held change asked again may have been cut differently, e.g. after context_tokens changed).
INSERT INTO judge_prompts (watch, content_hash, judge_version, model, system_prompt,
                           user_prompt, sent_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (watch, content_hash, judge_version, model) DO UPDATE SET
    system_prompt = EXCLUDED.system_prompt,
    user_prompt = EXCLUDED.user_prompt,
    sent_at = EXCLUDED.sent_at
