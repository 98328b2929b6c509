-- A sync replaces its source's rejected records (in its transaction): the ones it rejects
-- again come back with insert_rejected_records_staged.sql, so a re-run leaves the same rows.
DELETE FROM rejected_records WHERE source = $1
