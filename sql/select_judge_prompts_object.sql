-- The prompts sent about one object's evaluated changes, by change: through each evaluation's
-- content, judge version and model (a cached verdict shows the prompt that produced it). The
-- verdict cache keys a deleted object's content as 'deleted:' and its last hash.
SELECT e.change_id, p.content_hash, p.system_prompt, p.user_prompt, p.sent_at
FROM evaluations AS e
JOIN judge_prompts AS p
  ON p.watch = e.watch
 AND p.judge_version = e.judge_version
 AND p.model = e.model
 AND p.content_hash = CASE WHEN e.kind = 'delete' THEN 'deleted:' || e.content_hash
                           ELSE e.content_hash END
WHERE e.watch = $1 AND e.source = $2 AND e.object_key = $3
