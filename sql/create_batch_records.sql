-- Stage of a sync (DuckDB, not transpiled): a normalized batch (`rows`,
-- sql/select_checked_records.sql) as temporary table `cw_batch`, for the lookup in `stored`
-- (create_matched_batch.sql) and the inserts into `seen` and `fetched` that follow it.
CREATE OR REPLACE TEMP TABLE cw_batch AS
{rows}
