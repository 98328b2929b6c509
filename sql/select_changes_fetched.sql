-- Stage of a sync (DuckDB, not transpiled). One change-log row per changed key, with typed old
-- values (`old_rows`, read from the warehouse before they are replaced) and new values
-- (`fetched`) side by side. change_id continues the log ($1 is its next id) in the order of
-- the objects' updated-at, new then old, then key; the warehouse never sorts.
WITH ordered AS (
    -- The order is worked out on the keys and updated-at alone: a sort of the whole rows of a
    -- million-row first sync would not fit the stage's memory.
    SELECT {diff_keys}, row_number() OVER (ORDER BY {order}) AS n
    FROM diff AS d
    LEFT JOIN fetched AS f ON {fetched_join}
    LEFT JOIN old_rows AS o ON {old_join}
)
SELECT
    $1 - 1 + r.n AS change_id,
    CAST($2 AS VARCHAR) AS sync_id,
    d.kind,
    {object_key} AS object_key,
    d.old_hash,
    d.new_hash,
    CASE WHEN d.kind = 'update' THEN list_filter({changed}, lambda c: c IS NOT NULL) END
        AS changed_columns,
    CAST($3 AS TIMESTAMPTZ) AS detected_at,
    CAST($4 AS BOOLEAN) AS silent,
    CAST($5 AS BOOLEAN) AS held,
    {values}
FROM diff AS d
JOIN ordered AS r ON {ordered_join}
LEFT JOIN fetched AS f ON {fetched_join}
LEFT JOIN old_rows AS o ON {old_join}
