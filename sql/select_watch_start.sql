-- Where a watch that has never run starts: at the first change of the source's latest sync,
-- so a watch added to a source with history is told about what happens from now on, not
-- about everything that ever changed (a new source's baseline sync is the latest one). A
-- fleet's targets sync as `<fleet>[<target>]`: the first change of any target's latest sync.
SELECT coalesce(
    (SELECT min(c.change_id) - 1 FROM {changes} AS c
     WHERE c.sync_id IN (
         SELECT last_sync_id FROM sync_state
         WHERE source = $1 OR substr(source, 1, length($1) + 1) = $1 || '['
     )),
    (SELECT max(c.change_id) FROM {changes} AS c),
    0
)
