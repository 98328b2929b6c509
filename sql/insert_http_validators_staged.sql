INSERT INTO http_validators (source, request_key, etag, last_modified, walk)
SELECT source, request_key, etag, last_modified, walk FROM {stage}
