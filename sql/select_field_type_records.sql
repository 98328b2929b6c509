-- The JSON type of one field's first non-null value (run only for fields seen for the first
-- time, so its cost follows the drift, not the data).
SELECT json_type(raw, $1) AS json_type FROM records
WHERE json_type(raw, $1) NOT IN ('NULL')
ORDER BY _arrival
LIMIT 1
