-- Stage of a sync (DuckDB, not transpiled). The fetched rows to write when every one is new
-- (a first sync), in the source table's layout: all of them, with no semi join against the
-- diff (select_upserts_fetched.sql), which would hold every key in memory while the change
-- log's query, streamed out at the same time on PostgreSQL, needs the stage's memory to sort.
SELECT {columns}, f._content_hash, CAST($1 AS TIMESTAMPTZ) AS _synced_at, f._raw,
    f._raw_hash
FROM fetched AS f
