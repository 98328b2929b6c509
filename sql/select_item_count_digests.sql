-- How many items a digest window was sent with: a re-run reports that, not how many
-- notifications the window holds now.
SELECT item_count FROM digests WHERE digest = $1 AND window_start = $2
