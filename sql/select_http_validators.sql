SELECT request_key, etag, last_modified FROM http_validators WHERE source = $1
