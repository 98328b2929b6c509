-- What the judge model was sent about each content it judged, keyed like judge_cache: the
-- first request's system prompt (with what instructor adds) and the change as the model saw
-- it (cut to fit its context, if it was). `changewatch explain` shows it. Written right after
-- each call that sent a request, answered or not, so a held change's prompt is there too.
CREATE TABLE IF NOT EXISTS judge_prompts (
    watch TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    judge_version TEXT NOT NULL,
    model TEXT NOT NULL,
    system_prompt TEXT NOT NULL,
    user_prompt TEXT NOT NULL,
    sent_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (watch, content_hash, judge_version, model)
)
