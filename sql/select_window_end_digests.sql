-- How far a digest has got: the end of the latest window it sent or wrote (NULL: none yet).
SELECT max(window_end) FROM digests WHERE digest = $1 AND status IN ('sent', 'written')
