-- SQLite (pipeline/webhooks/webhook_inbox.py). The last delivery of a source received so far: a sync that starts
-- fetching after it covers it. The inbox is pruned, so a scan stays small.
SELECT coalesce(max(seq), 0) FROM webhook_inbox WHERE source = ?
