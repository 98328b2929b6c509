-- Rows whose declared content did not change but whose payload did (undeclared fields moved)
-- get the current raw payload, and the columns evolved from it. No change-log entry: the
-- content hash did not move. Idempotent: rows whose payload is the same are not written.
UPDATE {table} AS t SET {assignments} FROM {stage} AS s
WHERE {key_join} AND CAST(t._raw AS TEXT) IS DISTINCT FROM s._raw
