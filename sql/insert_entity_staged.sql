-- Evolved columns (payload fields that appeared after the source was declared, not part of
-- the content hash) are read from the raw payload.
INSERT INTO {table} ({columns}, _content_hash, _synced_at, _raw, _raw_hash{evolved_columns})
SELECT {select_columns}, _content_hash, _synced_at, CAST(_raw AS JSON), _raw_hash{evolved_values}
FROM {stage}
