-- Stage of a sync (DuckDB, not transpiled). The fetched rows to write: inserts and the new
-- versions of updates, in the source table's layout, streamed out to the warehouse.
SELECT {columns}, f._content_hash, CAST($1 AS TIMESTAMPTZ) AS _synced_at, f._raw,
    f._raw_hash
FROM fetched AS f SEMI JOIN diff AS d ON {key_join} AND d.kind <> 'delete'
