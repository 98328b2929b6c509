-- Stage of a sync (DuckDB, not transpiled: it never runs in the warehouse). The keys whose
-- content hash differs from the stored one: insert (not stored), update (hash differs) or,
-- when the fetch listed everything, delete (stored, not fetched). `stored` holds the stored
-- keys and hashes, streamed in from the warehouse; unchanged keys are left out, and so are the
-- keys in `seen` (fetched and matching their stored version, see insert_seen_batch.sql).
CREATE OR REPLACE TABLE diff AS
SELECT
    {keys},
    CASE
        WHEN s._content_hash IS NULL THEN 'insert'
        WHEN f._content_hash IS NULL THEN 'delete'
        ELSE 'update'
    END AS kind,
    s._content_hash AS old_hash,
    f._content_hash AS new_hash
FROM fetched AS f {join} JOIN (FROM stored AS s ANTI JOIN seen AS w ON {seen_join}) AS s
    ON {key_join}
WHERE f._content_hash IS DISTINCT FROM s._content_hash
