-- Keys and hashes of one fleet target's stored rows: a target's snapshot compares (and so
-- deletes) only its own rows, never another target's in the same table.
SELECT {primary_key}, _content_hash, _raw_hash FROM {table} WHERE {column} = $1
