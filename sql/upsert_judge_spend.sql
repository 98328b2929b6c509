-- Adds one evaluation's spend to its day; concurrent evaluations of one watch are serialized
-- by the watch's evaluation lock, and the increment is atomic in the row anyway.
INSERT INTO judge_spend (watch, day, calls, prompt_tokens, completion_tokens)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (watch, day) DO UPDATE SET
    calls = judge_spend.calls + EXCLUDED.calls,
    prompt_tokens = judge_spend.prompt_tokens + EXCLUDED.prompt_tokens,
    completion_tokens = judge_spend.completion_tokens + EXCLUDED.completion_tokens
