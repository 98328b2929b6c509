-- One row per (notification, channel): the delivery state machine.
-- pending -> sending -> sent; a failure goes back to pending with a later next_attempt_at,
-- or to dead after the attempt limit. A send a crash cut short ('sending' past the lease) goes
-- back to pending where the receiver recognises a repeat (webhook, file), else becomes dead
-- (an email could arrive twice; those channels deliver at most once). A debounced
-- notification's deliveries start 'debounced' until next_attempt_at, the end of its window,
-- then become pending, or 'suppressed' (never sent; last_error says why).
CREATE TABLE IF NOT EXISTS deliveries (
    notification_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    claimed_at TIMESTAMPTZ,
    delivered_at TIMESTAMPTZ,
    last_error TEXT,
    PRIMARY KEY (notification_id, channel)
)
