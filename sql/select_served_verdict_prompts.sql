-- A watch's verdicts from its served judge, with the prompt each was asked with: the learned
-- stage's weak labels. Verdicts the learned stage gave itself are left out (their reasoning
-- starts with its note): a model must not learn from its own answers.
SELECT p.user_prompt, j.should_notify, j.confidence
FROM judge_cache AS j
JOIN judge_prompts AS p
  ON p.watch = j.watch AND p.content_hash = j.content_hash
 AND p.judge_version = j.judge_version AND p.model = j.model
WHERE j.watch = $1 AND j.reasoning NOT LIKE '[learned stage:%'
ORDER BY j.content_hash
