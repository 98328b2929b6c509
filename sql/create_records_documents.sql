-- Step 1 of normalization (DuckDB, in memory): one row per record of the fetched documents,
-- each record's JSON text kept as it came (a fleet target's with its target merged in), and
-- its arrival position.
CREATE OR REPLACE TEMP TABLE records AS
SELECT doc_index * 1000000000 + pos AS _arrival, {record} AS raw
FROM (
    SELECT doc_index, unnest(recs) AS raw, unnest(range(len(recs))) AS pos
    FROM (SELECT doc_index, from_json({records}, '["JSON"]') AS recs FROM documents)
)
