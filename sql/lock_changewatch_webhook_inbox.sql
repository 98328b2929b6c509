-- PostgreSQL (pipeline/webhooks/webhook_inbox_postgres.py). Writers of the inbox take this transaction lock
-- first: seqs then commit in the order they were given, so a reader that saw seq n never
-- sees a smaller one commit later and skip it (its cursor only moves forward). Held for one
-- insert, a millisecond; the table's creation takes it too, so two hosts never race on it.
SELECT pg_advisory_xact_lock(hashtext('changewatch_webhook_inbox'))
