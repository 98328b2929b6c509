-- Keys and hashes of every stored row: a snapshot sync compares the whole listing.
SELECT {primary_key}, _content_hash, _raw_hash FROM {table}
