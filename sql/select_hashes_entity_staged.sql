-- Keys and hashes of just the fetched rows: an incremental sync costs what it fetched.
SELECT {t_primary_key}, t._content_hash, t._raw_hash FROM {table} AS t JOIN {stage} AS s ON {key_join}
