-- PostgreSQL (pipeline/webhooks/webhook_inbox_postgres.py). The highest seq the table's sequence ever gave (0
-- before the first): a sensor cursor beyond it means the table was replaced, and starts again.
SELECT coalesce(
    pg_sequence_last_value(pg_get_serial_sequence('changewatch_webhook_inbox', 'seq')::regclass),
    0
)
