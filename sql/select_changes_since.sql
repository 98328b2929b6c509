-- A source's changes after a known change_id, oldest first (for the CLI and the demo).
SELECT * FROM {changes}
WHERE change_id > $1
ORDER BY change_id
