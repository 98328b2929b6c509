-- PostgreSQL (pipeline/webhooks/webhook_inbox_postgres.py). After a sync of the source committed: the
-- deliveries it covered (received before it began) are done. Only the first sync marks one;
-- the count says how many this one marked.
WITH marked AS (
    UPDATE changewatch_webhook_inbox
    SET consumed_at = $1, consumed_by = $2
    WHERE source = $3 AND seq <= $4 AND consumed_at IS NULL
    RETURNING seq
)
SELECT count(*) FROM marked
