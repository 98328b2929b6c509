-- One validator of a sync (a walk of a few requests; more are staged, see
-- sql/insert_http_validators_staged.sql). Runs after delete_http_validators in the sync's
-- transaction, so it never meets an older row of its key.
INSERT INTO http_validators (source, request_key, etag, last_modified, walk)
VALUES ($1, $2, $3, $4, $5)
