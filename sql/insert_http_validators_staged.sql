INSERT INTO http_validators (source, request_key, etag, last_modified)
SELECT source, request_key, etag, last_modified FROM {stage}
