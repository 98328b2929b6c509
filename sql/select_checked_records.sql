-- Step 2 of normalization for rows that stay in DuckDB (a sync's stage): the normalized
-- records (select_normalized_records.sql) but `_bad_value`. A record with a bad value or no
-- primary key aborts the statement, so a batch is written whole or not at all; the caller
-- then finds the first such record for its message, off the common path.
SELECT * EXCLUDE (_bad_value)
FROM (
{normalized}
)
WHERE CASE WHEN _bad_value IS NULL AND {has_key} THEN TRUE ELSE error('changewatch: a bad record') END
