-- change_id is given in the stage (next id + the change's place in the sync): no sort here.
-- The staged columns are those the sync's changes fill (an insert has no old values).
INSERT INTO {changes} ({columns})
SELECT {select_values}
FROM {stage}
