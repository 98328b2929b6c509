-- Changes waiting for `changewatch release` (a change storm was detected).
SELECT count(*) FROM {changes} WHERE held
