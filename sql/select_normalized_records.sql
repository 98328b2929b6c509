-- Step 2 of normalization (DuckDB, in memory, not transpiled: it never runs in the
-- warehouse). Each record is parsed once more, against the schema of the declared columns.
--
-- The content hash is defined here and only here: SHA-256 of the declared columns as one JSON
-- object with sorted keys. Undeclared fields, the raw payload and bookkeeping are not part of
-- it, so a new upstream field or a reordered config changes no hash.
--
-- _raw_hash only tells whether the stored raw payload is still the one upstream sends (a sync
-- ships a payload to the warehouse when it moved, see sql/insert_fetched_batch.sql): DuckDB's
-- 64-bit hash() of the text, a third of SHA-256's cost here; 63 bits so both backends store it
-- as BIGINT. Should another DuckDB hash differently, every payload is rewritten once.
WITH typed AS (
    SELECT _arrival, raw, json_transform(raw, {schema}) AS d FROM records
),
columns AS (
    SELECT {column_exprs}, _arrival, raw FROM typed
)
SELECT
    {columns},
    sha256(to_json(struct_pack({hash_fields}))) AS _content_hash,
    CAST(raw AS VARCHAR) AS _raw,
    CAST(hash(CAST(raw AS VARCHAR)) >> 1 AS BIGINT) AS _raw_hash,
    {bad_value} AS _bad_value,
    _arrival
FROM columns
-- (no ORDER BY: polars orders the rows by _arrival, cheaper than sorting wide rows here)
