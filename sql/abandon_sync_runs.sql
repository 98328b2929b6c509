-- A 'running' record older than the current sync of the same source belongs to a process that
-- died (killed, out of memory): mark it so, as nothing else ever will.
UPDATE sync_runs
SET status = 'abandoned', error = 'the sync process ended before finishing'
WHERE source = $1 AND status = 'running' AND sync_id <> $2
