-- Stage of a sync (DuckDB, not transpiled: it never runs in the warehouse). The keys whose
-- content hash differs from the stored one: insert (not stored), update (hash differs) or,
-- when the fetch listed everything, delete (stored, not fetched). `stored` holds the stored
-- keys and hashes, streamed in from the warehouse; unchanged keys are left out, among them
-- the rows staged as matching their stored version (NULL _raw, see insert_fetched_batch.sql).
CREATE OR REPLACE TABLE diff AS
SELECT
    {keys},
    CASE
        WHEN s._content_hash IS NULL THEN 'insert'
        WHEN f._arrival IS NULL THEN 'delete'
        ELSE 'update'
    END AS kind,
    s._content_hash AS old_hash,
    f._content_hash AS new_hash
FROM fetched AS f {join} JOIN stored AS s ON {key_join}
WHERE f._arrival IS NULL OR (f._raw IS NOT NULL AND f._content_hash IS DISTINCT FROM s._content_hash)
