-- Retention: the records of finished sync runs that started before $1.
DELETE FROM sync_runs WHERE started_at < $1 AND status <> 'running'
RETURNING sync_id
