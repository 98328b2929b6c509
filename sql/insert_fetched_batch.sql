-- Stage of a sync (DuckDB, not transpiled). The rows of a normalized batch (`cw_batch`) that
-- do not match their stored version (see create_matched_batch.sql), whole.
INSERT INTO fetched BY NAME
FROM cw_batch ANTI JOIN cw_matched USING (_arrival)
