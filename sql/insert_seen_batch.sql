-- Stage of a sync (DuckDB, not transpiled). The rows of a normalized batch (`cw_batch`) that
-- match their stored version keep only what the sync still reads of them: key, updated-at
-- (the cursor, and which copy of an object seen twice is newest) and arrival. Their other
-- columns and their payload would only fill the stage, and spill, for nothing.
INSERT INTO seen BY NAME
SELECT {kept}, _arrival FROM cw_batch SEMI JOIN cw_matched USING (_arrival)
