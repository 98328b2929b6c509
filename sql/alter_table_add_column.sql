-- A column declared (or introduced by a release) after the table was created.
ALTER TABLE {table} ADD COLUMN {column} {sql_type}
