DELETE FROM http_validators WHERE source = $1
