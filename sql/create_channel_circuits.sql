-- One row per channel that ever failed: its circuit. open: sends go; paused: a run of
-- temporary failures stopped its sends until a probe at probe_at gets through; disabled: the
-- receiver answered 410 Gone, nothing is sent until `changewatch resume --channel`.
-- A channel without a row is open.
CREATE TABLE IF NOT EXISTS channel_circuits (
    channel TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    failures INTEGER NOT NULL,
    probes INTEGER NOT NULL,
    probe_at TIMESTAMPTZ,
    last_error TEXT,
    changed_at TIMESTAMPTZ NOT NULL
)
