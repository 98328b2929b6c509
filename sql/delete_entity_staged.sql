-- Removes updated and deleted keys before the new versions are inserted: an upsert that reads
-- the same on both backends. Runs inside the sync transaction, so readers never see the gap.
DELETE FROM {table} AS t USING {stage} AS s WHERE {key_join}
