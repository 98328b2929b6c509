-- SQLite (pipeline/webhooks/webhook_inbox.py). The highest seq the file ever gave (AUTOINCREMENT keeps it past
-- pruning): a sensor cursor beyond it means the file was replaced, and starts again from 0.
SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'webhook_inbox'), 0)
