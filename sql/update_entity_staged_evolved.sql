-- When new fields become columns, every fetched row gets them (and its current raw payload),
-- not only the rows whose declared content changed: a one-time cost at the drift.
UPDATE {table} AS t SET {assignments} FROM {stage} AS s WHERE {key_join}
