-- Notifications to send. dedupe_key is derived from data (watch, object, version or
-- transition, condition version) and UNIQUE: evaluations insert with ON CONFLICT DO NOTHING,
-- so repeated or concurrent evaluations can never create a second notification.
CREATE TABLE IF NOT EXISTS outbox (
    notification_id TEXT PRIMARY KEY,
    dedupe_key TEXT NOT NULL UNIQUE,
    watch TEXT NOT NULL,
    source TEXT NOT NULL,
    object_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    change_id BIGINT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    url TEXT,
    urgency TEXT NOT NULL,
    summary TEXT,
    payload TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    -- Debounce (watch `debounce:`): the end of the window the notification waits out, when it
    -- was settled, and why it was suppressed (NULL: sent as usual).
    due_at TIMESTAMPTZ,
    settled_at TIMESTAMPTZ,
    suppressed TEXT,
    -- When the change was detected: with change_id (the source's change sequence), every
    -- payload carries it, so a receiver can drop a notification older than one it has.
    changed_at TIMESTAMPTZ
)
