-- Stage of a sync (DuckDB, not transpiled). One normalized batch (`cw_batch`) enters the stage,
-- looked up in `stored` (the stored keys and hashes, loaded before the walk). A row whose
-- content hash and raw hash are the stored ones keeps only what the sync still reads of it:
-- key, updated-at (the cursor, and which copy of an object seen twice is newest) and arrival;
-- a NULL _raw marks it. The rest would only fill the stage, and spill, for nothing.
INSERT INTO fetched BY NAME
SELECT {kept}, {slimmed}, _arrival
FROM (
    SELECT
        b.*,
        coalesce(s._content_hash = b._content_hash AND s._raw_hash = b._raw_hash, FALSE) AS _same
    FROM cw_batch AS b LEFT JOIN stored AS s ON {key_join}
)
