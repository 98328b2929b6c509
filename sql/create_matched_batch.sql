-- Stage of a sync (DuckDB, not transpiled). The rows of a normalized batch (`cw_batch`) whose
-- content hash and raw hash are the stored ones (`stored`, loaded before the walk). One lookup
-- in `stored` per batch; the batch is then split on these arrivals alone.
CREATE OR REPLACE TEMP TABLE cw_matched AS
SELECT b._arrival
FROM cw_batch AS b
JOIN stored AS s ON {key_join} AND s._content_hash = b._content_hash AND s._raw_hash = b._raw_hash
