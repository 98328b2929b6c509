SELECT j.content_hash, j.should_notify, j.urgency, j.summary, j.reasoning, j.confidence
FROM judge_cache AS j JOIN {stage} AS s ON j.content_hash = s.content_hash
WHERE j.watch = $1 AND j.judge_version = $2 AND j.model = $3
