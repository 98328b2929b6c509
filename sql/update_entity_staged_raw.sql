-- Rows whose declared content did not change but whose payload did (undeclared fields moved)
-- get the current raw payload, its hash, and the columns evolved from it. No change-log entry:
-- the content hash did not move. Idempotent: rows whose payload hash is the same are not
-- written (and the stored payloads are not read).
UPDATE {table} AS t SET {assignments} FROM {stage} AS s
WHERE {key_join} AND t._raw_hash IS DISTINCT FROM s._raw_hash
