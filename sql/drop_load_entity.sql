-- PostgreSQL only. A first sync's load table, left over when its sync failed or was killed:
-- its name belongs to one source, whose syncs run one at a time (under the source's lock).
DROP TABLE IF EXISTS {stage}
