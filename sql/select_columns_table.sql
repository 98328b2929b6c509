SELECT column_name FROM information_schema.columns
WHERE table_name = $1 AND table_schema = current_schema()
