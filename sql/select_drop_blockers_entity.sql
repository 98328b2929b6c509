-- PostgreSQL only. Why table $1 (a quoted name) cannot be replaced by a copy made with
-- `CREATE TABLE ... (LIKE ... INCLUDING DEFAULTS, CONSTRAINTS, STORAGE, COMPRESSION)` and its
-- primary key: one row per thing that copy would lose or a DROP would refuse, none when the
-- table is only what changewatch made of it. Anything else that depends on the table (an
-- index, view, trigger, rule, policy, foreign key, statistics object, publication, owned
-- sequence) counts, whatever its kind, so a kind PostgreSQL adds later is on the safe side.
WITH t AS (SELECT * FROM pg_class WHERE oid = CAST($1 AS regclass))
SELECT 'not a plain permanent table' FROM t
WHERE relkind <> 'r' OR relispartition OR relpersistence <> 'p'
UNION ALL
SELECT 'owned by another role' FROM t WHERE relowner <> (
    SELECT oid FROM pg_roles WHERE rolname = current_user
)
UNION ALL
SELECT 'privileges granted' FROM t WHERE relacl IS NOT NULL
UNION ALL
SELECT 'row-level security' FROM t WHERE relrowsecurity OR relforcerowsecurity
UNION ALL
SELECT 'storage options' FROM t
WHERE reloptions IS NOT NULL OR reltablespace <> 0 OR relreplident <> 'd'
    OR relam <> (
        SELECT oid FROM pg_am WHERE amname = current_setting('default_table_access_method')
    )
UNION ALL
SELECT 'inheritance' FROM pg_inherits, t WHERE inhrelid = t.oid OR inhparent = t.oid
UNION ALL
SELECT 'comment' FROM pg_description, t
WHERE objoid = t.oid AND classoid = CAST('pg_class' AS regclass)
UNION ALL
SELECT 'security label' FROM pg_seclabel, t
WHERE objoid = t.oid AND classoid = CAST('pg_class' AS regclass)
UNION ALL
-- Column options are matched by name: the server may keep its own entries there.
SELECT 'column ' || attname || ' has statistics settings, privileges or no plain value'
FROM pg_attribute, t
WHERE attrelid = t.oid AND attnum > 0 AND NOT attisdropped
    AND (attstattarget <> -1 OR attacl IS NOT NULL OR attidentity <> '' OR attgenerated <> ''
        OR EXISTS (SELECT FROM unnest(attoptions) AS o WHERE o LIKE 'n\_distinct%'))
UNION ALL
-- The copy numbers its columns anew: positions would move.
SELECT 'dropped columns' FROM t
WHERE EXISTS (SELECT FROM pg_attribute WHERE attrelid = t.oid AND attisdropped)
UNION ALL
-- Dependents of the table, its row type and that type's array type, but those the copy
-- recreates: the row types themselves, the TOAST table, column defaults, check constraints
-- and the primary key. (Looked up by index: a scan of pg_depend costs enough in the planner's
-- eyes to have the query compiled, which takes longer than running it.)
SELECT pg_describe_object(d.classid, d.objid, d.objsubid)
FROM t, (
    SELECT CAST('pg_class' AS regclass) AS classid, oid FROM t
    UNION ALL
    SELECT CAST('pg_type' AS regclass), reltype FROM t
    UNION ALL
    SELECT CAST('pg_type' AS regclass), typarray FROM pg_type, t WHERE pg_type.oid = t.reltype
) AS r
JOIN pg_depend AS d ON d.refclassid = r.classid AND d.refobjid = r.oid
WHERE d.deptype <> 'e'
    AND NOT (d.classid = CAST('pg_type' AS regclass) AND d.deptype = 'i')
    AND NOT (d.classid = CAST('pg_attrdef' AS regclass))
    AND NOT (d.classid = CAST('pg_class' AS regclass) AND d.objid = t.reltoastrelid)
    AND NOT (d.classid = CAST('pg_constraint' AS regclass) AND d.objid IN (
        SELECT oid FROM pg_constraint WHERE conrelid = t.oid AND contype IN ('p', 'c')
    ))
