-- Stage of a sync (DuckDB, not transpiled). The change log of a sync whose every fetched row
-- is new (a first sync): one insert per row of `fetched`, numbered as in
-- select_changes_fetched.sql (updated-at, then key), with no diff or old rows to join and
-- none of the columns an insert leaves empty (old values, old hash, changed columns).
WITH ordered AS (
    -- Keys and updated-at alone are sorted, as in select_changes_fetched.sql.
    SELECT {keys}, row_number() OVER (ORDER BY {order}) AS n
    FROM fetched AS f
)
SELECT
    $1 - 1 + r.n AS change_id,
    CAST($2 AS VARCHAR) AS sync_id,
    'insert' AS kind,
    {object_key} AS object_key,
    f._content_hash AS new_hash,
    CAST($3 AS TIMESTAMPTZ) AS detected_at,
    CAST($4 AS BOOLEAN) AS silent,
    CAST($5 AS BOOLEAN) AS held,
    {values}
FROM fetched AS f
JOIN ordered AS r ON {ordered_join}
