-- The changes a watch has not settled yet: everything after its watermark, plus the ones
-- held earlier (judge unavailable). The filter runs here, in the warehouse, as a column.
SELECT c.*, coalesce(({filter}), FALSE) AS _passed
FROM {changes} AS c
WHERE c.change_id > $1
   OR c.change_id IN (
       SELECT e.change_id FROM evaluations AS e
       WHERE e.watch = $2 AND e.source = $3 AND e.decision = 'held'
   )
ORDER BY c.change_id
