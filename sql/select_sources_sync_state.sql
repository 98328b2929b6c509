-- The sources a warehouse holds data of: the demo wipes a warehouse only if they are its own.
SELECT source FROM sync_state ORDER BY source
