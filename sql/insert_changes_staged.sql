-- change_id is given in polars (next id + the change's place in the sync): no sort here.
INSERT INTO {changes} (change_id, sync_id, kind, object_key, old_hash, new_hash, changed_columns,
                       detected_at, silent, held, {value_columns})
SELECT change_id, sync_id, kind, object_key, old_hash, new_hash, changed_columns,
       detected_at, silent, held, {select_values}
FROM {stage}
