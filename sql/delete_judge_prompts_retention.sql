-- Retention: prompts sent before $1 go with the verdicts of that age (retention.verdicts).
DELETE FROM judge_prompts WHERE sent_at < $1
