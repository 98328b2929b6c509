SELECT request_key, etag, last_modified, walk FROM http_validators WHERE source = $1
