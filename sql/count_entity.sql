SELECT count(*) FROM {table}
