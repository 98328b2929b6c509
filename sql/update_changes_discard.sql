-- Discards held changes: they stay in the log, marked silent, and are never evaluated.
UPDATE {changes} SET held = FALSE, silent = TRUE WHERE held
RETURNING change_id
