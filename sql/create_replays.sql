-- What a replay of a watch over stored history found, change by change: whether it was
-- notified then and whether it would be with the replayed filter and condition. Keyed by the
-- replay's version (a hash of that filter and condition), so replaying the same edit again
-- replaces its rows instead of adding to them.
CREATE TABLE IF NOT EXISTS replays (
    replay_version TEXT NOT NULL,
    watch TEXT NOT NULL,
    source TEXT NOT NULL,
    change_id BIGINT NOT NULL,
    object_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    sent BOOLEAN NOT NULL,
    would_send BOOLEAN,
    -- added | dropped | same | undecided (the judge could not answer, or its cap was hit)
    -- | duplicate (would notify, but an earlier change in the replay notifies its key)
    outcome TEXT NOT NULL,
    reason TEXT,
    where_text TEXT NOT NULL,
    condition_text TEXT,
    replayed_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (replay_version, watch, source, change_id)
)
