-- The decisions view of an older release, replaced by the current definition.
DROP VIEW IF EXISTS decisions
