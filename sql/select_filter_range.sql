-- A watch's filter over the candidate changes $3 with ids in [$1, $2], used only to find which
-- change a failing filter fails on (see evaluators.evaluate): the ids that pass, or an error.
SELECT c.change_id, coalesce(({filter}), FALSE) AS passed
FROM {changes} AS c
WHERE c.change_id BETWEEN $1 AND $2 AND c.change_id = ANY(CAST($3 AS BIGINT[]))
