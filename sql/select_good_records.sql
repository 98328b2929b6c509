-- Step 2 of normalization for a `skip` source's batch that holds bad records (DuckDB, not
-- transpiled): the normalized records (select_normalized_records.sql) with a good value in
-- every column and a primary key; the others are rejected (sources/rejections.py), not stored.
SELECT * EXCLUDE (_bad_value)
FROM (
{normalized}
)
WHERE _bad_value IS NULL AND {has_key}
