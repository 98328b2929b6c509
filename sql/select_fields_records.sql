-- The top-level fields the fetched records carry (for schema drift: fields that appear
-- upstream after the source was declared). One pass of json_keys over the records.
SELECT DISTINCT unnest(json_keys(raw)) AS field FROM records ORDER BY field
