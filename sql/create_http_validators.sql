-- ETag / Last-Modified of each request of a source's last successful sync, sent back as
-- If-None-Match / If-Modified-Since. Replaced in the same transaction as the rows they
-- describe: a validator never runs ahead of the data it vouches for. `walk` names the walk a
-- request belonged to; with every request of it stored (validators or not), the next sync can
-- tell that a page or a parent vanished even when every page left answers 304.
CREATE TABLE IF NOT EXISTS http_validators (
    source TEXT NOT NULL,
    request_key TEXT NOT NULL,
    etag TEXT,
    last_modified TEXT,
    walk TEXT,
    PRIMARY KEY (source, request_key)
)
