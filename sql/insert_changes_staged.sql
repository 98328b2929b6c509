-- change_id comes from the sequence in stage order, so one sync's changes read in order.
INSERT INTO {changes} (sync_id, kind, object_key, old_hash, new_hash, changed_columns,
                       detected_at, silent, held, {value_columns})
SELECT sync_id, kind, object_key, old_hash, new_hash, changed_columns,
       detected_at, silent, held, {select_values}
FROM {stage}
ORDER BY _order
