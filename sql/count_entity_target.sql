-- Rows of one fleet target: its sync_state row counts its own rows only.
SELECT count(*) FROM {table} WHERE {column} = $1
