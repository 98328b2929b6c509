-- The tables and views `changewatch sql` may read: those of the warehouse's schema, with the
-- database and schema that qualify them (one row with a NULL table when there are none yet).
SELECT current_database() AS catalog_name, current_schema() AS schema_name, t.table_name
FROM (SELECT 1 AS one) AS one
LEFT JOIN information_schema.tables AS t
  ON t.table_schema = current_schema() AND t.table_catalog = current_database()
