-- How many records of a source its last sync rejected, and the first (for the check's line).
SELECT count(*), min(record_key) FROM rejected_records WHERE source = $1
