-- Stage of a sync (DuckDB, not transpiled), with nothing stored to look rows up in (a first
-- sync): a normalized batch (`rows`, sql/select_checked_records.sql), whole.
INSERT INTO fetched BY NAME
{rows}
