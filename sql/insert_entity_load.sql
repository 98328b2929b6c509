-- PostgreSQL only. A first sync's loaded rows into a source table that can no longer simply be
-- replaced (someone indexed, granted or filled it during the load): an ordinary insert.
INSERT INTO {table} ({columns}) SELECT {columns} FROM {stage}
