-- Records of a source whose on_bad_record is `skip` that its last sync could not store: the
-- record's primary key (sorted-key JSON, or its place in the fetch when it has none), the
-- field at fault and why. Replaced by every sync of the source, in its transaction: a record
-- that is stored at last, or no longer served, leaves no row behind.
CREATE TABLE IF NOT EXISTS rejected_records (
    source TEXT NOT NULL,
    record_key TEXT NOT NULL,
    field TEXT NOT NULL,
    reason TEXT NOT NULL,
    sync_id TEXT NOT NULL,
    rejected_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (source, record_key, field)
)
