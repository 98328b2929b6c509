-- change_id orders one source's changes; syncs of a source never overlap, so it only grows.
CREATE SEQUENCE IF NOT EXISTS {sequence}
