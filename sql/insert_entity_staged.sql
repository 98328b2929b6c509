INSERT INTO {table} ({columns}, _content_hash, _synced_at, _raw)
SELECT {select_columns}, _content_hash, _synced_at, CAST(_raw AS JSON) FROM {stage}
