-- The records a sync rejected, one per key and field (deduplicated before staging), after
-- delete_rejected_records.sql in the same transaction.
INSERT INTO rejected_records (source, record_key, field, reason, sync_id, rejected_at)
SELECT source, record_key, field, reason, sync_id, rejected_at FROM {stage}
