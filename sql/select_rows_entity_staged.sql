-- Current values of the rows about to change, for the change log's old_* columns.
SELECT {columns} FROM {table} AS t JOIN {stage} AS s ON {key_join}
