-- Recorded in the sync transaction; a field is first seen once.
INSERT INTO source_fields (source, field, field_type, action, first_seen_at, sync_id)
SELECT source, field, field_type, action, first_seen_at, sync_id FROM {stage}
ON CONFLICT (source, field) DO NOTHING
