-- Normalization, run by DuckDB in memory over the documents of one fetch (DuckDB dialect, not
-- transpiled: it never runs in the warehouse). Each record is parsed once, against the schema
-- of the declared columns.
--
-- The content hash is defined here and only here: SHA-256 of the declared columns as one JSON
-- object with sorted keys. Undeclared fields, the raw payload and bookkeeping are not part of
-- it, so a new upstream field or a reordered config changes no hash.
WITH records AS (
    SELECT doc_index, unnest(recs) AS raw, unnest(range(len(recs))) AS pos
    FROM (SELECT doc_index, from_json({records}, '["JSON"]') AS recs FROM documents)
),
typed AS (
    SELECT doc_index * 1000000000 + pos AS _arrival, raw, json_transform(raw, {schema}) AS d
    FROM records
),
columns AS (
    SELECT {column_exprs}, _arrival, raw FROM typed
)
SELECT
    {columns},
    sha256(to_json(struct_pack({hash_fields}))) AS _content_hash,
    CAST(raw AS VARCHAR) AS _raw,
    {bad_value} AS _bad_value,
    _arrival
FROM columns
ORDER BY _arrival
