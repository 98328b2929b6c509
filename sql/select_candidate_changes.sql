-- The changes a watch has not settled yet: everything after its watermark, the ones it held
-- earlier (judge unavailable, or its filter failed on their values), and ones released from
-- a change-storm hold since. Silent
-- changes (a baseline, a backfill) and changes still held by the storm guard are skipped.
-- The filter runs here, in the warehouse, as a column.
SELECT c.*, coalesce(({filter}), FALSE) AS _passed
FROM {changes} AS c
WHERE NOT c.silent AND NOT c.held AND (
    c.change_id > $1
    OR c.change_id IN (
        SELECT e.change_id FROM evaluations AS e
        WHERE e.watch = $2 AND e.source = $3 AND e.decision IN ('held', 'filter_error')
    )
    OR (
        c.released_at IS NOT NULL
        AND c.change_id NOT IN (
            SELECT e.change_id FROM evaluations AS e WHERE e.watch = $2 AND e.source = $3
        )
    )
)
ORDER BY c.change_id
