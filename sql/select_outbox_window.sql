-- The notifications of some watches created in [start, end), for a digest.
SELECT * FROM outbox
WHERE created_at >= $1 AND created_at < $2 AND watch IN (SELECT unnest(CAST($3 AS TEXT[])))
ORDER BY watch, created_at DESC
