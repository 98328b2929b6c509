-- Judge calls and tokens per watch and UTC day: the daily budget (`max_calls_per_day`) reads
-- it, and it answers "what did the judge cost this month" in plain SQL.
CREATE TABLE IF NOT EXISTS judge_spend (
    watch TEXT NOT NULL,
    day DATE NOT NULL,
    calls INTEGER NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    PRIMARY KEY (watch, day)
)
